#include "kernels/cpu/sum_exp.h"

#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/exp_simd.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu {
namespace {

// 8 exps per step, summed in two double vectors of 4 lanes each (a float lane would lose
// the small terms of a 100k-entry sum).
__attribute__((target("avx2,fma"))) double sum_exp_avx2(const float* x, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = detail::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
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
    _mm256_store_ps(e, detail::exp8(_mm256_sub_ps(_mm256_load_ps(tail), m)));
    for (int j = 0; i + j < n; ++j) sum += e[j];
  }
  return sum;
}

// exp_shifted's vector loop: 8 weights per step, stored, and summed as in sum_exp_avx2.
__attribute__((target("avx2,fma"))) double exp_shifted_avx2(const float* x, int64_t n, float max, float temperature,
                                                            float* out) {
  const __m256 m = _mm256_set1_ps(max), t = _mm256_set1_ps(temperature);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = detail::exp8(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), t));
    _mm256_storeu_ps(out + i, e);
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
    _mm256_store_ps(e, detail::exp8(_mm256_div_ps(_mm256_sub_ps(_mm256_load_ps(tail), m), t)));
    for (int j = 0; i + j < n; ++j) sum += out[i + j] = e[j];
  }
  return sum;
}

}  // namespace

double exp_shifted(const float* x, int64_t n, float max, float temperature, float* out) {
  if (detected_cpu_isa() >= CpuIsa::kAvx2) return exp_shifted_avx2(x, n, max, temperature, out);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp((x[i] - max) / temperature);
  return sum;
}

double sum_exp_shifted(const float* x, int64_t n, float max) {
  // The sampler's, not a backend's: it runs on the host whatever the backend, so the CPU's
  // own flavour (CpuKernelOptions::isa is a backend's choice).
  if (detected_cpu_isa() >= CpuIsa::kAvx2) return sum_exp_avx2(x, n, max);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - max);
  return sum;
}

}  // namespace tessera::cpu
