// AVX-512 inner loops of the tiled CPU attention (attention_tile.h): the AVX2 ones at twice
// the width (a 64-key block is 4 vectors of scores, a 64-wide head 4 vectors of the value
// accumulator), the same exp polynomial. At 512-token prefill on the ~100M Llama the scores
// and value updates were a third of the linears' time on 8-wide vectors. Key blocks are
// gathered by the AVX2 gathers (widening, and 8 x 8 transposes for the transposed form;
// memory bound either way).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/exp_simd.h"

#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define TESSERA_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

static_assert(kKeyBlock % 16 == 0, "a key block is whole 16-lane vectors");

TESSERA_TARGET_AVX512 void scores_avx512(const float* q, const float* kt, int64_t head_dim, int64_t n, float* s) {
  constexpr int kVecs = static_cast<int>(kKeyBlock / 16);
  __m512 acc[kVecs];
  for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_setzero_ps();
  const int vecs = static_cast<int>((n + 15) / 16);
  if (vecs == kVecs) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m512 qd = _mm512_set1_ps(q[d]);
      const float* row = kt + d * kKeyBlock;
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 16 * v), acc[v]);
    }
  } else {
    // Columns past the block's keys (up to the next 16) hold stale finite values; their
    // scores are computed and dropped.
    for (int64_t d = 0; d < head_dim; ++d) {
      const __m512 qd = _mm512_set1_ps(q[d]);
      const float* row = kt + d * kKeyBlock;
      for (int v = 0; v < vecs; ++v) acc[v] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 16 * v), acc[v]);
    }
  }
  int64_t j = 0;
  for (int v = 0; v < vecs; ++v, j += 16) {
    if (j + 16 <= n) {
      _mm512_storeu_ps(s + j, acc[v]);
    } else {
      _mm512_mask_storeu_ps(s + j, static_cast<__mmask16>((1u << (n - j)) - 1u), acc[v]);
    }
  }
}

// Sixteen vectors of partial sums to one vector of their totals, lane i = sum of p[i]:
// pairs interleaved and added within 128-bit lanes, then pairs of those shuffled so each
// 128-bit lane holds 4 keys' partials, then the 128-bit lanes of pairs exchanged twice.
TESSERA_TARGET_AVX512 inline __m512 sum16_lanes(const __m512 p[16]) {
  __m512 s[8], u[4], w[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0x44), _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], 0xEE));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

TESSERA_TARGET_AVX512 void scores_rows_avx512(const float* q, const float* kr, int64_t head_dim, int64_t n, float* s) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t keys = std::min<int64_t>(16, n - j0);
    __m512 p[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) p[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 16) {
      const __mmask16 mask =
          head_dim - d >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (head_dim - d)) - 1u);
      const __m512 qd = _mm512_maskz_loadu_ps(mask, q + d);
      const float* k = kr + j0 * head_dim + d;
      // All 16 rows even past n (kr holds kKeyBlock rows; those lanes' sums are not stored):
      // a loop to `keys` indexes p at run time, which keeps all 16 accumulators in memory.
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) p[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, k + i * head_dim), qd, p[i]);
    }
    const __m512 total = sum16_lanes(p);
    if (keys == 16) {
      _mm512_storeu_ps(s + j0, total);
    } else {
      _mm512_mask_storeu_ps(s + j0, static_cast<__mmask16>((1u << keys) - 1u), total);
    }
  }
}

TESSERA_TARGET_AVX512 float exp_shifted_avx512(float* s, int64_t n, float max) {
  const __m512 m = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (j < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - j)) - 1u);
    const __m512 e = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), m)));
    _mm512_mask_storeu_ps(s + j, mask, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

TESSERA_TARGET_AVX512 void accumulate_avx512(const float* p, const float* v, int64_t n, int64_t head_dim,
                                             float rescale, float* acc) {
  const __m512 c = _mm512_set1_ps(rescale);
  int64_t d = 0;
  // 64 columns at a time in registers (4 vectors), then 16, then a masked tail.
  for (; d + 64 <= head_dim; d += 64) {
    __m512 a[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) a[i] = _mm512_mul_ps(_mm512_loadu_ps(acc + d + 16 * i), c);
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* row = v + j * head_dim + d;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(row + 16 * i), a[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + d + 16 * i, a[i]);
  }
  for (; d < head_dim; d += 16) {
    const __mmask16 mask =
        head_dim - d >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (head_dim - d)) - 1u);
    __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, acc + d), c);
    for (int64_t j = 0; j < n; ++j) {
      a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(mask, v + j * head_dim + d), a);
    }
    _mm512_mask_storeu_ps(acc + d, mask, a);
  }
}

}  // namespace

AttentionTileOps attention_tile_ops_avx512() {
  const AttentionTileOps avx2 = attention_tile_ops_avx2();
  return {avx2.gather, scores_avx512, exp_shifted_avx512, accumulate_avx512, avx2.gather_rows, scores_rows_avx512};
}

}  // namespace tessera::cpu::detail
