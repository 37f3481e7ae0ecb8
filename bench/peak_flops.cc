// Peak f32 FMA rate. Each thread keeps kChains independent accumulators in vector registers
// and updates each with a multiply-add per iteration: with an FMA latency of 4-5 cycles and
// two FMA pipes per core, 10-12 chains per thread keep both pipes full on the cores we run
// on (Zen 3/4, Skylake-X and later), so the figure is throughput, not latency. The
// multiplier is slightly below 1 and the addend slightly positive, so the values stay
// bounded and never become denormal or infinite.
#include "bench/peak_flops.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

// GCC 12 warns inside its own intrinsics (_mm512_reduce_add_ps extracts from a value built
// with _mm512_undefined_*, by design); the warning says nothing about this file.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tessera {
namespace {

constexpr int kChains = 12;

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

bool has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// Each *_fma_loop runs `iters` iterations of kChains vector FMAs; returns a value derived
// from the accumulators so the work cannot be optimised away.
__attribute__((target("avx512f"))) float avx512_fma_loop(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c + 1));
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) float avx2_fma_loop(long iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * static_cast<float>(c + 1));
  const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

float scalar_fma_loop(long iters) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 0.001f * static_cast<float>(c + 1);
  for (long i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * 0.999999f + 1e-6f;
  }
  float total = 0;
  for (float v : acc) total += v;
  return total;
}

// kChains chains of vdpbf16ps: each adds two bf16 products per f32 lane (64 flops per
// instruction). The products are ~1e-6, so after any realistic run the sums stay far from
// overflow.
__attribute__((target("avx512f,avx512bf16"))) float avx512_bf16_dot_loop(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c + 1));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}

struct Probe {
  float (*loop)(long);
  int flops_per_op;  // per chain update: 2 x f32 lanes for an FMA, 4 x lanes for a bf16 pair dot
};

Probe probe() {
  if (has_avx512()) return {avx512_fma_loop, 2 * 16};
  if (has_avx2_fma()) return {avx2_fma_loop, 2 * 8};
  return {scalar_fma_loop, 2};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double measure(const Probe& p, double seconds_per_try, int tries) {
  // Size the loop from a short single-thread calibration run, so each try lasts about
  // seconds_per_try whatever the clock.
  long iters = 1 << 16;
  volatile float sink = 0;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    sink = sink + p.loop(iters);
    const double t = seconds_since(start);
    if (t >= seconds_per_try / 4 || iters > (1L << 34)) {
      iters = std::max<long>(1, static_cast<long>(static_cast<double>(iters) * seconds_per_try / std::max(t, 1e-9)));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int r = 0; r < std::max(tries, 1); ++r) {
    const auto start = std::chrono::steady_clock::now();
    int threads = 1;
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
#pragma omp single
      threads = omp_get_num_threads();
      total += p.loop(iters);
    }
    const double t = seconds_since(start);
    sink = sink + total;
    const double flops = static_cast<double>(p.flops_per_op) * kChains * static_cast<double>(iters) * threads;
    best = std::max(best, flops / t / 1e9);
  }
  return best;
}

}  // namespace

const char* peak_fma_isa() {
  if (has_avx512()) return "avx512";
  return has_avx2_fma() ? "avx2" : "scalar";
}

double measure_peak_fma_gflop_s(double seconds_per_try, int tries) { return measure(probe(), seconds_per_try, tries); }

bool cpu_has_bf16_dot_probe() {
  __builtin_cpu_init();
  return has_avx512() && __builtin_cpu_supports("avx512bf16");
}

double measure_peak_bf16_dot_gflop_s(double seconds_per_try, int tries) {
  if (!cpu_has_bf16_dot_probe()) return 0.0;
  return measure({avx512_bf16_dot_loop, 4 * 16}, seconds_per_try, tries);
}

}  // namespace tessera
