// Latency of the shared-memory all_reduce between CPU ranks, each rank its own process
// (fork), as the worker runs them. Rank 0 times every call of a back-to-back loop and
// prints p50 / p90 / mean per call. Sizes: one decode token of a 768-wide model
// (768 x 4 B), of a 4096-wide model (4096 x 4 B), and a 4 MB prefill activation.
// World 4 is printed too but oversubscribes a 2-core machine (ranks then wait on yields).
//
// A plain timing program (its own main) rather than Google Benchmark: every rank must run
// exactly the same number of collectives, which Benchmark's adaptive iteration count
// cannot promise across processes.
//
//   build/bin/communicator_bench [--quick]
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

// Runs one rank's loop; rank 0 returns per-call latencies in microseconds.
std::vector<double> run_rank(const Case& c, const std::string& group, int rank, std::string& error) {
  auto comm = make_shm_communicator(group, rank, c.world, c.max_bytes, 30000);
  if (!comm.is_ok()) {
    error = comm.status().to_string();
    return {};
  }
  const int64_t count = c.bytes / static_cast<int64_t>(dtype_size(c.dtype));
  std::vector<char> data(c.bytes);
  for (int64_t i = 0; i < c.bytes; ++i) data[i] = static_cast<char>((i * 7 + rank) & 0x3f);
  std::vector<double> us;
  us.reserve(c.iters);
  const int warmup = std::max(10, c.iters / 10);
  for (int it = 0; it < warmup + c.iters; ++it) {
    const Clock::time_point t0 = Clock::now();
    Status s = (*comm)->all_reduce_sum(data.data(), count, c.dtype);
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

bool run_case(const Case& c, int index) {
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
  double mean = 0;
  for (double x : us) mean += x;
  mean /= static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[static_cast<size_t>(p * static_cast<double>(us.size() - 1))]; };
  std::printf("%-6s world %d %9lld B  max_bytes %8zu  iters %6d   p50 %9.2f us   p90 %9.2f us   mean %9.2f us   %7.2f GB/s(p50)\n",
              dtype_name(c.dtype), c.world, static_cast<long long>(c.bytes), c.max_bytes, c.iters, pct(0.5),
              pct(0.9), mean, static_cast<double>(c.bytes) / (pct(0.5) * 1e3));
  return true;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using tessera::Case;
  using tessera::DType;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
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
