// AVX2 + FMA inner loops of the tiled CPU attention (attention_tile.h). Scores are computed
// against a transposed key block (8 keys per vector, no horizontal sums), exp is a vector
// polynomial (|relative error| < 2e-7 against std::exp on the range softmax uses), and the
// value update keeps a 64-float accumulator row in registers.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/attention_tile.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace tessera::cpu::detail {
namespace {

// exp(x) for 8 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor
// polynomial (truncation error < 1.3e-7 relative), times 2^n built in the exponent bits.
// Lanes below -87.3 (e^x under the smallest normal float), -inf included, give 0.
TESSERA_TARGET_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 split in two
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(under, e);
}

TESSERA_TARGET_AVX2 float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

TESSERA_TARGET_AVX2 void scores_avx2(const float* q, const float* kt, int64_t head_dim, int64_t n, float* s) {
  constexpr int kVecs = static_cast<int>(kKeyBlock / 8);
  __m256 acc[kVecs];
  const int vecs = static_cast<int>((n + 7) / 8);
  for (int v = 0; v < kVecs; ++v) acc[v] = _mm256_setzero_ps();
  if (vecs == kVecs) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m256 qd = _mm256_broadcast_ss(q + d);
      const float* row = kt + d * kKeyBlock;
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[v] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row + 8 * v), acc[v]);
    }
  } else {
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m256 qd = _mm256_broadcast_ss(q + d);
      const float* row = kt + d * kKeyBlock;
      for (int v = 0; v < vecs; ++v) acc[v] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row + 8 * v), acc[v]);
    }
  }
  alignas(32) float tmp[kKeyBlock];
  for (int v = 0; v < vecs; ++v) _mm256_store_ps(tmp + 8 * v, acc[v]);
  for (int64_t j = 0; j < n; ++j) s[j] = tmp[j];
}

TESSERA_TARGET_AVX2 float exp_shifted_avx2(float* s, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum(sum);
  if (j < n) {
    alignas(32) float tail[8];
    for (int i = 0; i < 8; ++i) tail[i] = j + i < n ? s[j + i] : -INFINITY;
    const __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(tail), m));
    _mm256_store_ps(tail, e);
    for (int64_t i = 0; j + i < n; ++i) {
      s[j + i] = tail[i];
      total += tail[i];
    }
  }
  return total;
}

TESSERA_TARGET_AVX2 void accumulate_avx2(const float* p, const float* v, int64_t n, int64_t head_dim, float rescale,
                                         float* acc) {
  const __m256 c = _mm256_set1_ps(rescale);
  int64_t d = 0;
  // 32 columns at a time in registers (4 vectors), then 8, then a scalar tail.
  for (; d + 32 <= head_dim; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), c), a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), c);
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), c), a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), c);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 pj = _mm256_broadcast_ss(p + j);
      const float* row = v + j * head_dim + d;
      a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 8), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 16), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 24), a3);
    }
    _mm256_storeu_ps(acc + d, a0);
    _mm256_storeu_ps(acc + d + 8, a1);
    _mm256_storeu_ps(acc + d + 16, a2);
    _mm256_storeu_ps(acc + d + 24, a3);
  }
  for (; d + 8 <= head_dim; d += 8) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d), c);
    for (int64_t j = 0; j < n; ++j) a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + j * head_dim + d), a);
    _mm256_storeu_ps(acc + d, a);
  }
  for (; d < head_dim; ++d) {
    float a = acc[d] * rescale;
    for (int64_t j = 0; j < n; ++j) a = std::fma(p[j], v[j * head_dim + d], a);
    acc[d] = a;
  }
}

}  // namespace

AttentionTileOps attention_tile_ops_avx2() { return {scores_avx2, exp_shifted_avx2, accumulate_avx2}; }

}  // namespace tessera::cpu::detail
