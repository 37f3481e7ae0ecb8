// CPU linear layer: y[M, N] = x[M, K] · W[N, K]^T for f32/f16/bf16 weights.
//
// Decode (small M) streams every weight once per call, so its figure of merit is weight
// bytes per second against the machine's memory bandwidth (roofline = weight GB/s divided by
// measure_copy_bandwidth_gb_s(), measured once at start). To measure DRAM and not the 32 MiB
// L3, each benchmark rotates through enough copies of W to cover kColdFootprint bytes, as a
// real decode step does (it touches every layer's weights once). Prefill (large M) is
// compute bound: GFLOP/s.
//
//   build/bin/linear_bench [--benchmark_filter=BM_Linear/...]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "bench/memory_bandwidth.h"
#include "common/dtype.h"
#include "common/kernel_options.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera {
namespace {

namespace detail = cpu::detail;
using cpu::CpuIsa;
using cpu::cpu_isa_name;
using cpu::detected_cpu_isa;
using cpu::linear;

double g_copy_gb_s = 0;  // measured once in main()
// The kernels' defaults with the TESSERA_CPU_* variables over them (A/B runs), resolved once
// in main(); each benchmark starts from these and forces what it measures.
detail::LinearOptions g_options;

constexpr size_t kColdFootprint = size_t{192} << 20;  // 6x the L3

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// `copies` weight matrices [N, K] of `dtype`, 64-byte aligned, filled with small values.
class WeightSet {
 public:
  WeightSet(DType dtype, int64_t N, int64_t K, bool cold) : dtype_(dtype) {
    bytes_ = static_cast<size_t>(N * K) * dtype_size(dtype);
    const size_t copies = cold ? std::max<size_t>(1, (kColdFootprint + bytes_ - 1) / bytes_) : 1;
    stride_ = (bytes_ + 63) / 64 * 64;
    data_.reset(std::aligned_alloc(64, stride_ * copies));
    count_ = copies;
    // Same values in every copy: cheap to make, and the kernel cannot tell.
    std::vector<float> row(K);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    for (float& v : row) v = dist(rng);
    char* base = static_cast<char*>(data_.get());
    for (int64_t i = 0; i < static_cast<int64_t>(copies) * N; ++i) {
      char* dst = base + (i / N) * stride_ + (i % N) * K * dtype_size(dtype);
      convert_elements(row.data(), DType::kF32, dst, dtype, K);
    }
  }
  const void* next() {
    const void* p = static_cast<const char*>(data_.get()) + next_ * stride_;
    next_ = (next_ + 1) % count_;
    return p;
  }
  size_t bytes() const { return bytes_; }
  size_t count() const { return count_; }

 private:
  DType dtype_;
  size_t bytes_ = 0, stride_ = 0, count_ = 1, next_ = 0;
  std::unique_ptr<void, FreeDeleter> data_;
};

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

void set_counters(benchmark::State& state, int64_t M, int64_t N, int64_t K, size_t w_bytes) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] = benchmark::Counter(
      iters * w_bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(iters * 2.0 * M * N * K / 1e9,
                                                 benchmark::Counter::kIsRate);
  // Weight GB/s as a fraction of the copy bandwidth (a rate counter, so scaled up front).
  state.counters["roofline"] = benchmark::Counter(iters * w_bytes / 1e9 / g_copy_gb_s,
                                                  benchmark::Counter::kIsRate);
}

void run_linear(benchmark::State& state, const detail::LinearOptions& options, DType dtype,
                int64_t M, int64_t N, int64_t K) {
  WeightSet weights(dtype, N, K, /*cold=*/true);
  std::vector<float> x(M * K, 0.01f), bias(N, 0.1f), y(M * N);
  for (auto _ : state) {
    detail::linear_with(options, x.data(), M, K, K, weights.next(), dtype, N, bias.data(),
                        y.data(), N, Activation::kNone);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, M, N, K, weights.bytes());
  state.SetLabel(std::string(dtype_name(dtype)) + " " +
                 cpu_isa_name(std::min(options.isa, detected_cpu_isa())));
}

// Args: dtype index, M, N, K. The engine's default path.
void BM_Linear(benchmark::State& state) {
  run_linear(state, g_options, kDtypes[state.range(0)], state.range(1),
             state.range(2), state.range(3));
}
BENCHMARK(BM_Linear)
    ->ArgNames({"dtype", "M", "N", "K"})
    ->ArgsProduct({{0, 1, 2}, {1, 4, 8, 64, 512}, {768}, {768}})
    ->ArgsProduct({{0, 1, 2}, {1, 4, 8, 64, 512}, {2048}, {768}})
    ->ArgsProduct({{0, 1, 2}, {1, 4, 8, 64, 512}, {768}, {2048}})
    ->ArgsProduct({{0, 1, 2}, {1, 4, 8, 64, 512}, {4096}, {4096}})
    // The ~1.1B Llama's (docs/benchmarks.md): fused q/k/v, fused gate/up, down.
    ->ArgsProduct({{0, 2}, {1, 8}, {2560, 11264}, {2048}})
    ->ArgsProduct({{0, 2}, {1, 8}, {2048}, {5632}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Decode kernel per instruction-set flavour. Args: dtype, isa, M; W is 4096x4096.
void BM_GemvIsa(benchmark::State& state) {
  detail::LinearOptions options = g_options;
  options.isa = static_cast<CpuIsa>(state.range(1));
  options.path = detail::LinearPath::kGemv;
  if (options.isa > detected_cpu_isa()) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  run_linear(state, options, kDtypes[state.range(0)], state.range(2), 4096, 4096);
}
BENCHMARK(BM_GemvIsa)
    ->ArgNames({"dtype", "isa", "M"})
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}, {1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// GEMV vs sgemm around the crossover (linear_gemv_max_rows()). Args: dtype, path (1 gemv,
// 2 gemm), M; W is 4096x4096.
void BM_GemvGemmCrossover(benchmark::State& state) {
  detail::LinearOptions options = g_options;
  options.path = static_cast<detail::LinearPath>(state.range(1));
  run_linear(state, options, kDtypes[state.range(0)], state.range(2), 4096, 4096);
}
BENCHMARK(BM_GemvGemmCrossover)
    ->ArgNames({"dtype", "path", "M"})
    ->ArgsProduct({{0, 2}, {1, 2}, {4, 8, 12, 16, 32}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The two OpenBLAS/OpenMP threading policies of the sgemm regime (see linear_gemm.cc).
// Args: dtype, threading (0 kBlasThreads, 1 kOmpPanels), M, N, K. Each iteration also runs
// one M=1 decode call on another matrix, as an engine alternating prefill chunks with
// decode and other OpenMP ops does, so time lost to the other pool's spinning shows up.
void BM_GemmThreading(benchmark::State& state) {
  const DType dtype = kDtypes[state.range(0)];
  const int64_t M = state.range(2), N = state.range(3), K = state.range(4);
  detail::LinearOptions options = g_options;
  options.path = detail::LinearPath::kGemm;
  options.threading = static_cast<detail::GemmThreading>(state.range(1));
  WeightSet weights(dtype, N, K, /*cold=*/false);
  WeightSet decode_weights(dtype, 2048, 2048, /*cold=*/false);
  std::vector<float> x(M * K, 0.01f), y(M * N), xd(2048, 0.01f), yd(2048);
  for (auto _ : state) {
    detail::linear_with(options, x.data(), M, K, K, weights.next(), dtype, N, nullptr, y.data(),
                        N, Activation::kNone);
    detail::linear_with(g_options, xd.data(), 1, 2048, 2048, decode_weights.next(), dtype, 2048, nullptr, yd.data(),
                        2048, Activation::kGeluTanh);
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(yd.data());
  }
  set_counters(state, M, N, K, weights.bytes());
  state.SetLabel(std::string(dtype_name(dtype)) +
                 (state.range(1) == 0 ? " blas-threads" : " omp-panels"));
}
BENCHMARK(BM_GemmThreading)
    ->ArgNames({"dtype", "threading", "M", "N", "K"})
    ->ArgsProduct({{0, 2}, {0, 1}, {64, 512}, {4096}, {4096}})
    ->ArgsProduct({{0, 2}, {0, 1}, {64}, {768}, {768}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The two GEMMs of the M > gemv-rows regime (issue 17), weights cold as in a decode or
// prefill step. Args: dtype, kernel (0 OpenBLAS sgemm with widening, 1 packed GEMM packing
// per call, 2 packed GEMM on weights packed once beforehand, 3 the GEMV kernel, for the
// crossover), M, N, K. Compare within one
// run with --benchmark_repetitions=N --benchmark_enable_random_interleaving=true.
void BM_GemmKernel(benchmark::State& state) {
  const DType dtype = kDtypes[state.range(0)];
  const int kernel = static_cast<int>(state.range(1));
  const int64_t M = state.range(2), N = state.range(3), K = state.range(4);
  const CpuIsa isa = g_options.isa;
  if ((kernel == 1 || kernel == 2) && !detail::gemm_packed_supported(isa)) {
    state.SkipWithError("no packed GEMM kernel for this CPU");
    return;
  }
  WeightSet weights(dtype, N, K, /*cold=*/true);
  std::vector<detail::PackedWeights> packed;
  if (kernel == 2) {
    for (size_t i = 0; i < weights.count(); ++i) {
      packed.push_back(detail::PackedWeights::pack(isa, {weights.next(), dtype, N, K}));
    }
  }
  detail::LinearOptions options = g_options;
  options.path = kernel == 3 ? detail::LinearPath::kGemv : detail::LinearPath::kGemm;
  options.gemm = kernel == 0 ? detail::GemmKernel::kOpenBlas : detail::GemmKernel::kPacked;
  std::vector<float> x(M * K, 0.01f), y(M * N);
  size_t next = 0;
  for (auto _ : state) {
    if (kernel == 2) {
      const detail::LinearArgs args{x.data(), M, K, K, nullptr, dtype, N, nullptr, y.data(), N, Activation::kNone};
      detail::gemm_packed(isa, args, &packed[next]);
      next = (next + 1) % packed.size();
    } else {
      detail::linear_with(options, x.data(), M, K, K, weights.next(), dtype, N, nullptr, y.data(), N,
                          Activation::kNone);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, M, N, K, weights.bytes());
  static const char* const kNames[] = {" openblas", " packed", " prepacked", " gemv"};
  state.SetLabel(std::string(dtype_name(dtype)) + kNames[kernel]);
}
// The ~100M Llama's gate|up (4096 x 768) and down (768 x 2048) projections and the ~1.1B
// Llama's (11264 x 2048, 2048 x 5632).
BENCHMARK(BM_GemmKernel)
    ->ArgNames({"dtype", "kernel", "M", "N", "K"})
    ->ArgsProduct({{0, 2}, {0, 1, 2}, {8, 32, 64, 512}, {4096}, {768}})
    ->ArgsProduct({{0, 2}, {0, 1, 2}, {8, 32, 64, 512}, {768}, {2048}})
    ->ArgsProduct({{0, 2}, {0, 1, 2}, {8, 32, 64, 512}, {11264}, {2048}})
    ->ArgsProduct({{0, 2}, {0, 1, 2}, {8, 32, 64, 512}, {2048}, {5632}})
    // GEMV vs packed GEMM around linear_gemv_max_rows().
    ->ArgsProduct({{0, 2}, {1, 3}, {2, 4, 8, 12, 16, 24}, {4096}, {768}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const tessera::StatusOr<tessera::KernelOptions> kernels = tessera::kernel_options_from_environment();
  if (!kernels.is_ok()) {
    std::fprintf(stderr, "linear_bench: %s\n", kernels.status().to_string().c_str());
    return 1;
  }
  tessera::g_options = tessera::cpu::detail::linear_options(kernels.value().cpu);
  tessera::g_copy_gb_s = tessera::measure_copy_bandwidth_gb_s();
  const double read_gb_s = tessera::measure_read_bandwidth_gb_s();
  std::printf("threads: %d  isa: %s  copy bandwidth: %.2f GB/s (read+write)  read bandwidth: %.2f GB/s\n",
              omp_get_max_threads(), tessera::cpu::cpu_isa_name(tessera::g_options.isa),
              tessera::g_copy_gb_s, read_gb_s);
  std::fflush(stdout);
  benchmark::AddCustomContext("copy_bandwidth_gb_s", std::to_string(tessera::g_copy_gb_s));
  benchmark::AddCustomContext("read_bandwidth_gb_s", std::to_string(read_gb_s));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
