#pragma once
// How many CPU threads a CPU rank runs, and on which cores. Ranks on one host share its
// cores: rank r keeps an equal, disjoint share of the cores this process may run on (its
// affinity mask), so the ranks' thread teams never fight over a core; and a rank runs one
// thread per core of its share, fewer when the container's CPU quota (cgroup cpu.max) allows
// fewer. A team larger than its cores spins at every barrier against itself: on a 2-core
// host, two ranks of two threads each took 17 s for a 40-token request that one thread each
// serves in 0.02 s.
#include <optional>
#include <string>

namespace tessera {

struct CpuShare {
  int cores = 0;                      // cores in this rank's affinity mask (after the split)
  std::optional<double> quota_cores;  // the cgroup's CPU quota in cores; none when unlimited
  int threads = 0;                    // threads to run
  std::string reason;                 // how `threads` was chosen, for the log
  bool oversubscribed = false;        // an explicit thread count above what the share holds
};

// The cgroup (v2 cpu.max, else v1 cpu.cfs_quota_us / cpu.cfs_period_us) CPU quota of this
// process in cores; none when unlimited or unreadable.
std::optional<double> cgroup_cpu_quota();

// Restricts this process to rank's share of the cores (world ranks on this host) and
// decides its thread count: `requested` when > 0 (flagged when more than the share holds),
// else OMP_NUM_THREADS's when `omp_num_threads_set`, else the share's cores, capped by the
// quota divided among the ranks.
CpuShare take_cpu_share(int rank, int world, int requested, bool omp_num_threads_set);

}  // namespace tessera
