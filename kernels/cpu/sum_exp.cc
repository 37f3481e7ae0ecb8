#include "kernels/cpu/sum_exp.h"

#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/exp_simd.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu {
namespace {

// exp((x - max) / temperature) of 8 floats; without kWeights (sum_exp_shifted) no division.
template <bool kWeights>
__attribute__((target("avx2,fma"))) inline __m256 shifted_exp8(__m256 x, __m256 max, __m256 temperature) {
  const __m256 shifted = _mm256_sub_ps(x, max);
  return detail::exp8(kWeights ? _mm256_div_ps(shifted, temperature) : shifted);
}

// 8 exps per step, summed in two double vectors of 4 lanes each (a float lane would lose
// the small terms of a 100k-entry sum); with kWeights each exp is stored in out too.
template <bool kWeights>
__attribute__((target("avx2,fma"))) double exp_row_avx2(const float* x, int64_t n, float max, float temperature,
                                                        float* out) {
  const __m256 m = _mm256_set1_ps(max), t = _mm256_set1_ps(temperature);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = shifted_exp8<kWeights>(_mm256_loadu_ps(x + i), m, t);
    if constexpr (kWeights) _mm256_storeu_ps(out + i, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(lo, hi));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  if (i < n) {
    alignas(32) float tail[8];
    for (int j = 0; j < 8; ++j) tail[j] = i + j < n ? x[i + j] : -INFINITY;
    alignas(32) float e[8];
    _mm256_store_ps(e, shifted_exp8<kWeights>(_mm256_load_ps(tail), m, t));
    for (int j = 0; i + j < n; ++j) {
      if constexpr (kWeights) out[i + j] = e[j];
      sum += e[j];
    }
  }
  return sum;
}

}  // namespace

double exp_shifted(const float* x, int64_t n, float max, float temperature, float* out) {
  if (detected_cpu_isa() >= CpuIsa::kAvx2) return exp_row_avx2<true>(x, n, max, temperature, out);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp((x[i] - max) / temperature);
  return sum;
}

double sum_exp_shifted(const float* x, int64_t n, float max) {
  // The sampler's, not a backend's: it runs on the host whatever the backend, so the CPU's
  // own flavour (CpuKernelOptions::isa is a backend's choice).
  if (detected_cpu_isa() >= CpuIsa::kAvx2) return exp_row_avx2<false>(x, n, max, 1.0f, nullptr);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - max);
  return sum;
}

}  // namespace tessera::cpu
