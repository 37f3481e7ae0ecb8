// Latency of the all_reduce between CPU ranks, each rank its own process, as the worker runs
// them. Rank 0 times every call of a back-to-back loop and prints p50 / p90 / mean per call.
//
//   build/bin/communicator_bench [--quick]
//     shared memory, ranks forked: one decode token of a 768-wide model (768 x 4 B), of a
//     4096-wide model (4096 x 4 B), and a 4 MB prefill activation; world 4 is printed too but
//     oversubscribes a 2-core machine (ranks then wait on yields).
//   build/bin/communicator_bench --sweep shm
//     shared memory, world 2 (forked), f32 messages of 4 KB to 16 MB.
//   build/bin/communicator_bench --sweep gloo --rank R --rendezvous DIR --address A
//     Gloo, world 2, the same sizes; one rank per invocation (bench/collectives_bench.sh runs
//     the two in two network namespaces joined by a veth pair), meeting in folder DIR.
//
// A plain timing program (its own main) rather than Google Benchmark: every rank must run
// exactly the same number of collectives, which Benchmark's adaptive iteration count
// cannot promise across processes.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "common/dtype.h"
#include "worker/gloo_communicator.h"
#include "worker/shm_communicator.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct Case {
  int world;
  int64_t bytes;
  DType dtype;
  size_t max_bytes;
  int iters;
};

// Runs one rank's loop on `comm`; rank 0 returns per-call latencies in microseconds.
std::vector<double> time_rank(Communicator& comm, const Case& c, int rank, std::string& error) {
  const int64_t count = c.bytes / static_cast<int64_t>(dtype_size(c.dtype));
  std::vector<char> data(c.bytes);
  for (int64_t i = 0; i < c.bytes; ++i) data[i] = static_cast<char>((i * 7 + rank) & 0x3f);
  std::vector<double> us;
  us.reserve(c.iters);
  const int warmup = std::max(10, c.iters / 10);
  for (int it = 0; it < warmup + c.iters; ++it) {
    const Clock::time_point t0 = Clock::now();
    Status s = comm.all_reduce_sum(data.data(), count, c.dtype);
    const Clock::time_point t1 = Clock::now();
    if (!s.is_ok()) {
      error = s.to_string();
      return {};
    }
    if (it >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    // Keep values finite and bounded across thousands of in-place sums.
    if (c.dtype == DType::kF32 && it % 8 == 7) std::memset(data.data(), 0, 64);
  }
  return us;
}

std::vector<double> run_rank(const Case& c, const std::string& group, int rank, std::string& error) {
  auto comm = make_shm_communicator(group, rank, c.world, c.max_bytes, 30000);
  if (!comm.is_ok()) {
    error = comm.status().to_string();
    return {};
  }
  return time_rank(**comm, c, rank, error);
}

void print_row(const char* kind, const Case& c, std::vector<double> us) {
  double mean = 0;
  for (double x : us) mean += x;
  mean /= static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[static_cast<size_t>(p * static_cast<double>(us.size() - 1))]; };
  std::printf("%-5s %-6s world %d %9lld B  iters %6d   p50 %9.2f us   p90 %9.2f us   mean %9.2f us   %7.3f GB/s(p50)\n",
              kind, dtype_name(c.dtype), c.world, static_cast<long long>(c.bytes), c.iters, pct(0.5), pct(0.9), mean,
              static_cast<double>(c.bytes) / (pct(0.5) * 1e3));
}

// f32 messages of 4 KB to 16 MB, world 2.
std::vector<Case> sweep_cases(bool quick) {
  std::vector<Case> out;
  for (int64_t bytes = 4 << 10; bytes <= (16 << 20); bytes *= 4) {
    const int iters = bytes <= (64 << 10) ? (quick ? 500 : 3000) : bytes <= (1 << 20) ? (quick ? 100 : 500) : (quick ? 20 : 60);
    out.push_back({2, bytes, DType::kF32, 4u << 20, iters});
  }
  return out;
}

// One Gloo rank of a world-2 sweep; rank 0 prints.
int run_gloo_sweep(int rank, const std::string& rendezvous, const std::string& address, bool quick) {
  GlooOptions g;
  g.rank = rank;
  g.world_size = 2;
  g.address = address;
  auto comm = make_gloo_communicator(g, *make_folder_rendezvous(rendezvous));
  if (!comm.is_ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().to_string().c_str());
    return 1;
  }
  for (const Case& c : sweep_cases(quick)) {
    std::string error;
    std::vector<double> us = time_rank(**comm, c, rank, error);
    if (!error.empty()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, error.c_str());
      return 1;
    }
    if (rank == 0) print_row("gloo", c, us);
  }
  return 0;
}

bool run_case(const Case& c, int index, const char* kind = "shm") {
  const std::string group = "bench" + std::to_string(::getpid()) + "-" + std::to_string(index);
  std::vector<pid_t> peers;
  for (int r = 1; r < c.world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string error;
      run_rank(c, group, r, error);
      if (!error.empty()) std::fprintf(stderr, "rank %d: %s\n", r, error.c_str());
      ::_exit(error.empty() ? 0 : 1);
    }
    peers.push_back(pid);
  }
  std::string error;
  std::vector<double> us = run_rank(c, group, 0, error);
  bool ok = error.empty();
  for (pid_t p : peers) {
    int st = 0;
    ::waitpid(p, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  if (!ok || us.empty()) {
    std::fprintf(stderr, "world %d, %lld bytes: failed: %s\n", c.world, static_cast<long long>(c.bytes),
                 error.c_str());
    return false;
  }
  print_row(kind, c, std::move(us));
  return true;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using tessera::Case;
  using tessera::DType;
  std::string sweep, rendezvous, address = "127.0.0.1";
  int rank = 0;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--quick") {
      quick = true;
    } else if (a == "--sweep" && has_value) {
      sweep = argv[++i];
    } else if (a == "--rank" && has_value) {
      rank = std::atoi(argv[++i]);
    } else if (a == "--rendezvous" && has_value) {
      rendezvous = argv[++i];
    } else if (a == "--address" && has_value) {
      address = argv[++i];
    } else {
      std::fprintf(stderr, "communicator_bench: unknown or incomplete argument %s (see the file's head)\n", a.c_str());
      return 2;
    }
  }
  if (sweep == "gloo") {
    if (rendezvous.empty() || (rank != 0 && rank != 1)) {
      std::fprintf(stderr, "communicator_bench --sweep gloo needs --rank 0|1 and --rendezvous DIR\n");
      return 2;
    }
    return tessera::run_gloo_sweep(rank, rendezvous, address, quick);
  }
  if (sweep == "shm") {
    bool ok = true;
    int index = 0;
    for (const Case& c : tessera::sweep_cases(quick)) ok = tessera::run_case(c, 100 + index++) && ok;
    return ok ? 0 : 1;
  }
  if (!sweep.empty()) {
    std::fprintf(stderr, "communicator_bench: --sweep shm or gloo, not %s\n", sweep.c_str());
    return 2;
  }
  const int small_iters = quick ? 2000 : 20000;
  const int large_iters = quick ? 50 : 300;
  constexpr size_t kMax = 4u << 20;
  const std::vector<Case> cases = {
      {2, 768 * 4, DType::kF32, kMax, small_iters},
      {2, 768 * 4, DType::kBF16, kMax, small_iters},
      {2, 4096 * 4, DType::kF32, kMax, small_iters},
      {2, 4 << 20, DType::kF32, kMax, large_iters},
      {2, 4 << 20, DType::kF32, 1u << 20, large_iters},  // same message in 1 MB chunks
      {2, 4 << 20, DType::kBF16, kMax, large_iters},
      {4, 768 * 4, DType::kF32, kMax, small_iters / 4},
      {4, 4096 * 4, DType::kF32, kMax, small_iters / 4},
      {4, 4 << 20, DType::kF32, kMax, large_iters / 2},
  };
  bool ok = true;
  for (size_t i = 0; i < cases.size(); ++i) ok = tessera::run_case(cases[i], static_cast<int>(i)) && ok;
  return ok ? 0 : 1;
}
