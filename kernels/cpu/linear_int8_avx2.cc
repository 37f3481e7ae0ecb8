// AVX2 + FMA flavour of the int8 linear kernels. Per weight vector: 8 int8 loaded, widened to
// 8 f32 (vpmovsxbd + vcvtdq2ps), one FMA per row of x. Products of a group accumulate apart
// and are scaled once at the group's end, so the scale costs one FMA per group, not per
// weight. 16 registers hold MT x R group sums, MT x R totals and R weight vectors: tiles
// (MT rows of x, R weight rows) of (4, 1), (2, 2) and (1, 4) keep 4 to 8 FMA chains going.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/linear_int8_kernels.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace tessera::cpu::detail {
namespace {

TESSERA_TARGET_AVX2 inline __m256 load_q8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

TESSERA_TARGET_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// MT rows of x (from m0) against weight rows [n0, n1), R at a time; the last step re-reads
// row n1 - 1 for its missing rows and discards those sums.
template <int MT, int R>
TESSERA_TARGET_AVX2 void tile(const Int8LinearArgs& a, int64_t m0, int64_t n0, int64_t n1) {
  const int64_t K = a.K, G = a.group, groups = K / G;
  const float* xr[MT];
  for (int i = 0; i < MT; ++i) xr[i] = a.x + (m0 + i) * a.ldx;
  for (int64_t n = n0; n < n1; n += R) {
    const int8_t* row[R];
    const float* srow[R];
    for (int r = 0; r < R; ++r) {
      const int64_t nr = std::min(n + r, n1 - 1);
      row[r] = a.w + nr * K;
      srow[r] = a.scales + nr * groups;
    }
    __m256 total[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) total[i][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256 part[MT][R];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) part[i][r] = _mm256_setzero_ps();
      for (int64_t k = g * G; k < (g + 1) * G; k += 8) {
        __m256 wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = load_q8(row[r] + k);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m256 xv = _mm256_loadu_ps(xr[i] + k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) part[i][r] = _mm256_fmadd_ps(wv[r], xv, part[i][r]);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_set1_ps(srow[r][g]);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) total[i][r] = _mm256_fmadd_ps(part[i][r], s, total[i][r]);
      }
    }
    for (int r = 0; r < R && n + r < n1; ++r) {
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(hsum(total[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

}  // namespace

void gemv_int8_avx2(const Int8LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) tile<4, 1>(a, m, n0, n1);
  for (; m + 2 <= m1; m += 2) tile<2, 2>(a, m, n0, n1);
  for (; m < m1; ++m) tile<1, 4>(a, m, n0, n1);
}

TESSERA_TARGET_AVX2 void dequantize_int8_avx2(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out) {
  const int64_t K = a.K, G = a.group, groups = K / G;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* w = a.w + n * K;
    float* o = out + (n - n0) * K;
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 s = _mm256_set1_ps(a.scales[n * groups + g]);
      for (int64_t k = g * G; k < (g + 1) * G; k += 8) _mm256_storeu_ps(o + k, _mm256_mul_ps(load_q8(w + k), s));
    }
  }
}

}  // namespace tessera::cpu::detail

namespace tessera::cpu::detail {
namespace {

// MT rows of int8 x against weight rows [n0, n1), R at a time. Per 32 weights: |w| and
// sign(w) applied to x (vpsignb), vpmaddubsw (u8 x s8 -> pairs of s16: at most 2 x 127 x 127,
// no saturation, as |w|, |x| <= 127), vpmaddwd by 1 (-> s32), an integer add; a group's sum is
// converted and scaled once.
template <int MT, int R>
TESSERA_TARGET_AVX2 void dot_tile(const Int8DotArgs& d, int64_t m0, int64_t n0, int64_t n1) {
  const Int8LinearArgs& a = *d.a;
  const int64_t K = a.K, G = a.group, groups = K / G;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t n = n0; n < n1; n += R) {
    const int8_t* row[R];
    const float* srow[R];
    for (int r = 0; r < R; ++r) {
      const int64_t nr = std::min(n + r, n1 - 1);
      row[r] = a.w + nr * K;
      srow[r] = a.scales + nr * groups;
    }
    __m256 total[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) total[i][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256i part[MT][R];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) part[i][r] = _mm256_setzero_si256();
      for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
        __m256i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + k));
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d.xq + (m0 + i) * K + k));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(xv, wv[r]));
            part[i][r] = _mm256_add_epi32(part[i][r], _mm256_madd_epi16(p16, ones));
          }
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const float xs = d.xs[(m0 + i) * groups + g];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          total[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[i][r]), _mm256_set1_ps(srow[r][g] * xs), total[i][r]);
      }
    }
    for (int r = 0; r < R && n + r < n1; ++r) {
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(hsum(total[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

}  // namespace

void gemv_int8_dot_avx2(const Int8DotArgs& d, int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + 4 <= d.a->M; m += 4) dot_tile<4, 1>(d, m, n0, n1);
  for (; m + 2 <= d.a->M; m += 2) dot_tile<2, 2>(d, m, n0, n1);
  for (; m < d.a->M; ++m) dot_tile<1, 6>(d, m, n0, n1);
}

}  // namespace tessera::cpu::detail

namespace tessera::cpu::detail {
namespace {

// The 16-bit-x GEMV on AVX2 (the AVX-512 VNNI one's arithmetic, linear_int8_kernels.h): 16
// int8 weights widened to int16 (vpmovsxbw), vpmaddwd against 16 int16 x (8 exact int32
// pair sums), an integer add: 3 instructions per 16 weights and row of x where the f32
// kernel above needs 6. A pair sum is at most 2 x 127 x 32767 and a group of at most 256
// adds 16 of them per lane: 1.3e8 < 2^31.
template <int MT, int R>
TESSERA_TARGET_AVX2 void x16_tile(const Int16XArgs& d, int64_t m0, int64_t n0, int64_t n1) {
  const Int8LinearArgs& a = *d.a;
  const int64_t K = a.K, G = a.group, groups = K / G;
  for (int64_t n = n0; n < n1; n += R) {
    const int8_t* row[R];
    const float* srow[R];
    for (int r = 0; r < R; ++r) {
      const int64_t nr = std::min(n + r, n1 - 1);
      row[r] = a.w + nr * K;
      srow[r] = a.scales + nr * groups;
    }
    __m256 total[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) total[i][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256i part[MT][R];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) part[i][r] = _mm256_setzero_si256();
      for (int64_t k = g * G; k < (g + 1) * G; k += 16) {
        __m256i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + k)));
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d.xq + (m0 + i) * K + k));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) part[i][r] = _mm256_add_epi32(part[i][r], _mm256_madd_epi16(xv, wv[r]));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const float xs = d.xs[(m0 + i) * groups + g];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          total[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part[i][r]), _mm256_set1_ps(srow[r][g] * xs), total[i][r]);
      }
    }
    for (int r = 0; r < R && n + r < n1; ++r) {
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(hsum(total[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

}  // namespace

void gemv_int8_x16_avx2(const Int16XArgs& d, int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + 4 <= d.a->M; m += 4) x16_tile<4, 1>(d, m, n0, n1);
  for (; m + 2 <= d.a->M; m += 2) x16_tile<2, 2>(d, m, n0, n1);
  for (; m < d.a->M; ++m) x16_tile<1, 4>(d, m, n0, n1);
}

// quantize_row_int16_avx512's rule, 8 lanes at a time (same division and rounding, so the
// same values).
TESSERA_TARGET_AVX2 void quantize_row_int16_avx2(const float* x, int64_t K, int64_t group, int16_t* q, float* scales) {
  const __m256 lo = _mm256_set1_ps(-32767.0f), hi = _mm256_set1_ps(32767.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < K / group; ++g) {
    const float* xg = x + g * group;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t k = 0; k < group; k += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(xg + k), abs_mask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float scale = _mm_cvtss_f32(m4) / 32767.0f;
    scales[g] = scale;
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t k = 0; k < group; k += 16) {
      __m256i v[2];
      for (int h = 0; h < 2; ++h) {
        __m256 f = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(xg + k + 8 * h), s),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
        v[h] = scale == 0.0f ? _mm256_setzero_si256() : _mm256_cvtps_epi32(f);
      }
      // packs works within 128-bit lanes: (v0 lo, v1 lo, v0 hi, v1 hi) -> reorder the 64-bit quarters.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(v[0], v[1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * group + k), packed);
    }
  }
}

}  // namespace tessera::cpu::detail
