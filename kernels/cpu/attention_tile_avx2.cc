// AVX2 + FMA inner loops of the tiled CPU attention (attention_tile.h). Key blocks are
// widened and transposed 8 x 8 in registers. Scores are computed
// against a transposed key block (8 keys per vector, no horizontal sums), exp is a vector
// polynomial (|relative error| < 2e-7 against std::exp on the range softmax uses), and the
// value update keeps a 64-float accumulator row in registers.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/exp_simd.h"
#include "kernels/cpu/transpose_avx2.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

TESSERA_TARGET_AVX2 float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 8 elements of a cached row from element d, widened to f32 (f16 by vcvtph2ps, bf16 as the
// top half of an f32).
TESSERA_TARGET_AVX2 inline __m256 load8(const void* row, DType dtype, int64_t d) {
  if (dtype == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(row) + d);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + d));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

TESSERA_TARGET_AVX2 inline float load1(const void* row, DType dtype, int64_t d) {
  if (dtype == DType::kF32) return static_cast<const float*>(row)[d];
  const uint16_t h = static_cast<const uint16_t*>(row)[d];
  return dtype == DType::kF16 ? _cvtsh_ss(h) : bf16_to_f32(h);
}

// One row of head_dim cached elements widened to f32.
TESSERA_TARGET_AVX2 inline void widen_row(const void* row, DType dtype, int64_t head_dim, float* dst) {
  int64_t d = 0;
  for (; d + 8 <= head_dim; d += 8) _mm256_storeu_ps(dst + d, load8(row, dtype, d));
  for (; d < head_dim; ++d) dst[d] = load1(row, dtype, d);
}

TESSERA_TARGET_AVX2 void gather_avx2(const void* const* k_rows, const void* const* v_rows, DType dtype,
                                     int64_t head_dim, int32_t n, float* kt, float* vb) {
  const int64_t d_main = head_dim & ~int64_t{7};
  // K: 8 keys x 8 dims at a time, transposed in registers; keys past n load as zeros.
  for (int32_t i0 = 0; i0 < n; i0 += 8) {
    const int32_t keys = std::min<int32_t>(8, n - i0);
    for (int64_t d = 0; d < d_main; d += 8) {
      __m256 r[8], t[8];
      for (int i = 0; i < 8; ++i) r[i] = i < keys ? load8(k_rows[i0 + i], dtype, d) : _mm256_setzero_ps();
      transpose8x8(r, t);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(kt + (d + i) * kKeyBlock + i0, t[i]);
    }
    for (int64_t d = d_main; d < head_dim; ++d) {
      for (int i = 0; i < 8; ++i) kt[d * kKeyBlock + i0 + i] = i < keys ? load1(k_rows[i0 + i], dtype, d) : 0.0f;
    }
  }
  for (int32_t i = 0; i < n; ++i) widen_row(v_rows[i], dtype, head_dim, vb + i * head_dim);
}

TESSERA_TARGET_AVX2 void gather_rows_avx2(const void* const* k_rows, const void* const* v_rows, DType dtype,
                                          int64_t head_dim, int32_t n, int64_t groups, int64_t group_stride,
                                          float* kr, float* vb) {
  const size_t elem = dtype_size(dtype);
  for (int32_t i = 0; i < n; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      const auto* k = static_cast<const char*>(k_rows[i]) + g * head_dim * elem;
      widen_row(k, dtype, head_dim, kr + g * group_stride + i * head_dim);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const auto* v = static_cast<const char*>(v_rows[i]) + g * head_dim * elem;
      widen_row(v, dtype, head_dim, vb + g * group_stride + i * head_dim);
    }
  }
}

// Eight vectors of partial sums to one vector of their totals, lane i = sum of p[i]: pairs
// interleaved and added within 128-bit lanes (each lane then holds 4 keys' partials), then
// the two halves of the 128-bit lanes exchanged and added.
TESSERA_TARGET_AVX2 inline __m256 sum8_lanes(const __m256 p[8]) {
  __m256 s[4], u[2];
  for (int i = 0; i < 4; ++i) {
    s[i] = _mm256_add_ps(_mm256_unpacklo_ps(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_ps(p[2 * i], p[2 * i + 1]));
  }
  for (int i = 0; i < 2; ++i) {
    u[i] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44), _mm256_shuffle_ps(s[2 * i], s[2 * i + 1], 0xEE));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

TESSERA_TARGET_AVX2 void scores_rows_avx2(const float* q, const float* kr, int64_t head_dim, int64_t n, float* s) {
  const int64_t d_main = head_dim & ~int64_t{7};
  for (int64_t j0 = 0; j0 < n; j0 += 8) {
    const int64_t keys = std::min<int64_t>(8, n - j0);
    __m256 p[8];
    for (int i = 0; i < 8; ++i) p[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < d_main; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      for (int64_t i = 0; i < keys; ++i) p[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kr + (j0 + i) * head_dim + d), qd, p[i]);
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, sum8_lanes(p));
    for (int64_t i = 0; i < keys; ++i) {
      float tail = 0.0f;
      for (int64_t d = d_main; d < head_dim; ++d) tail += q[d] * kr[(j0 + i) * head_dim + d];
      s[j0 + i] = out[i] + tail;
    }
  }
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

AttentionTileOps attention_tile_ops_avx2() {
  return {gather_avx2, scores_avx2, exp_shifted_avx2, accumulate_avx2, gather_rows_avx2, scores_rows_avx2};
}

}  // namespace tessera::cpu::detail
