#include "kernels/cpu/gated_silu.h"

#include <immintrin.h>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/exp_simd.h"

namespace tessera::cpu {
namespace {

// silu(g) = g sigmoid(g), the sigmoid from e = e^-|g| (never above 1, so no overflow and a
// far-negative gate goes to 0): 1 / (1 + e) for g >= 0, e / (1 + e) below.
__attribute__((target("avx2,fma"))) inline __m256 gated_silu8(__m256 g, __m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 e = detail::exp8(_mm256_or_ps(g, sign));  // e^-|g|
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 sigmoid = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), g);  // g's sign bit picks e r
  return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u);
}

__attribute__((target("avx2,fma"))) void gated_silu_avx2(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, gated_silu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i == n) return;
  // The tail through the same lanes, so that no element's bits depend on the row's length.
  alignas(32) float gt[8] = {}, ut[8] = {}, ot[8];
  for (int64_t j = 0; i + j < n; ++j) {
    gt[j] = g[i + j];
    ut[j] = u[i + j];
  }
  _mm256_store_ps(ot, gated_silu8(_mm256_load_ps(gt), _mm256_load_ps(ut)));
  for (int64_t j = 0; i + j < n; ++j) out[i + j] = ot[j];
}

}  // namespace

void gated_silu_row(CpuIsa isa, const float* g, const float* u, int64_t n, float* out) {
  if (isa >= CpuIsa::kAvx2) return gated_silu_avx2(g, u, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = silu(g[i]) * u[i];
}

}  // namespace tessera::cpu
