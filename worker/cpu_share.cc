#include "worker/cpu_share.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

namespace tessera {
namespace {

std::vector<int> allowed_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  return cpus;
}

// Rank's equal, disjoint share of `cpus` (all of them for one rank, or when there are more
// ranks than cores: the OS then schedules).
std::vector<int> restrict_to_share(const std::vector<int>& cpus, int rank, int world) {
  if (world <= 1 || cpus.empty()) return cpus;
  const int per_rank = static_cast<int>(cpus.size()) / world;
  if (per_rank < 1) return cpus;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  std::vector<int> share;
  for (int i = 0; i < per_rank; ++i) {
    const int cpu = cpus[static_cast<size_t>(rank * per_rank + i)];  // rank < world: inside cpus
    CPU_SET(cpu, &mine);
    share.push_back(cpu);
  }
  if (sched_setaffinity(0, sizeof(mine), &mine) != 0) return cpus;
  return share;
}

}  // namespace

std::optional<double> cgroup_cpu_quota() {
  // cgroup v2: "max 100000" (unlimited) or "200000 100000" (2 cores).
  if (std::ifstream v2("/sys/fs/cgroup/cpu.max"); v2) {
    std::string quota;
    double period = 0;
    if (v2 >> quota >> period && quota != "max" && period > 0) {
      try {
        const double q = std::stod(quota);
        if (q > 0) return q / period;
      } catch (...) {
      }
    }
    return std::nullopt;
  }
  std::ifstream q1("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p1("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  double quota = -1, period = 0;
  if (q1 >> quota && p1 >> period && quota > 0 && period > 0) return quota / period;
  return std::nullopt;
}

CpuShare take_cpu_share(int rank, int world, int requested, bool omp_num_threads_set) {
  CpuShare s;
  const std::vector<int> share = restrict_to_share(allowed_cpus(), rank, world);
  s.cores = std::max<int>(1, static_cast<int>(share.size()));
  s.quota_cores = cgroup_cpu_quota();
  // The quota is the whole process tree's: each of the host's ranks gets its part of it.
  int usable = s.cores;
  if (s.quota_cores) usable = std::min(usable, std::max(1, static_cast<int>(std::floor(*s.quota_cores / std::max(world, 1)))));
  std::string share_text = std::to_string(s.cores) + " core(s) in this rank's share";
  if (s.quota_cores) {
    char quota[32];
    std::snprintf(quota, sizeof(quota), "%.2f", *s.quota_cores);
    share_text += ", cgroup quota " + std::string(quota) + " core(s) for " + std::to_string(world) + " rank(s)";
  }
  if (requested > 0) {
    s.threads = requested;
    s.oversubscribed = requested > usable;
    s.reason = "worker.threads (" + share_text + ")";
  } else if (omp_num_threads_set) {
    s.threads = 0;  // OpenMP's, from OMP_NUM_THREADS
    s.reason = "OMP_NUM_THREADS (" + share_text + ")";
  } else {
    s.threads = usable;
    s.reason = "one per core: " + share_text;
  }
  return s;
}

}  // namespace tessera
