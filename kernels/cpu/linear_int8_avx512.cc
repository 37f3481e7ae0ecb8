// AVX-512 flavour of the int8 linear kernels: the AVX2 scheme (linear_int8_avx2.cc) with 16
// lanes (vpmovsxbd zmm from 16 bytes) and 32 registers, so tiles of (8, 1), (4, 2), (2, 4)
// and (1, 8) rows of x x weight rows; and, where the CPU has AVX512_VNNI, the int8-activation
// dot-product kernel with vpdpbusd (64 multiply-adds per instruction).
// tests/kernels/linear_int8_test.cc runs both wherever the CPU has them.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/linear_int8_kernels.h"
#include "kernels/cpu/vnni_asm.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_* is "maybe uninitialized" by
// design: those lanes are overwritten); the warning says nothing about this file.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TESSERA_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

namespace tessera::cpu::detail {
namespace {

TESSERA_TARGET_AVX512 inline __m512 load_q8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <int MT, int R>
TESSERA_TARGET_AVX512 void tile(const Int8LinearArgs& a, int64_t m0, int64_t n0, int64_t n1) {
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
    __m512 total[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) total[i][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512 part[MT][R];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) part[i][r] = _mm512_setzero_ps();
      for (int64_t k = g * G; k < (g + 1) * G; k += 16) {
        __m512 wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = load_q8(row[r] + k);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m512 xv = _mm512_loadu_ps(xr[i] + k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) part[i][r] = _mm512_fmadd_ps(wv[r], xv, part[i][r]);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_set1_ps(srow[r][g]);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) total[i][r] = _mm512_fmadd_ps(part[i][r], s, total[i][r]);
      }
    }
    for (int r = 0; r < R && n + r < n1; ++r) {
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(_mm512_reduce_add_ps(total[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

}  // namespace

void gemv_int8_avx512(const Int8LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  int64_t m = m0;
  for (; m + 8 <= m1; m += 8) tile<8, 1>(a, m, n0, n1);
  for (; m + 4 <= m1; m += 4) tile<4, 2>(a, m, n0, n1);
  for (; m + 2 <= m1; m += 2) tile<2, 4>(a, m, n0, n1);
  for (; m < m1; ++m) tile<1, 8>(a, m, n0, n1);
}

TESSERA_TARGET_AVX512 void dequantize_int8_avx512(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out) {
  const int64_t K = a.K, G = a.group, groups = K / G;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* w = a.w + n * K;
    float* o = out + (n - n0) * K;
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 s = _mm512_set1_ps(a.scales[n * groups + g]);
      for (int64_t k = g * G; k < (g + 1) * G; k += 16) _mm512_storeu_ps(o + k, _mm512_mul_ps(load_q8(w + k), s));
    }
  }
}

}  // namespace tessera::cpu::detail

namespace tessera::cpu::detail {
namespace {

#define TESSERA_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

// vpdpbusd multiplies unsigned by signed bytes, so x goes in as x + 128 (an XOR of the sign
// bit) and the surplus 128 * sum(w) of each group is taken off at the group's end; sum(w)
// is one more vpdpbusd per weight vector, against a vector of ones, shared by every row of
// x. Groups of 32 (any multiple of 32) use the low half of a masked load, the high half
// reading as zeros. MT rows of x x R weight rows per tile; accumulators: MT x R group sums,
// R weight sums, MT x R f32 totals.
template <int MT, int R>
TESSERA_TARGET_AVX512_VNNI void dot_tile(const Int8DotArgs& d, int64_t m0, int64_t n0, int64_t n1) {
  const Int8LinearArgs& a = *d.a;
  const int64_t K = a.K, G = a.group, groups = K / G;
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t n = n0; n < n1; n += R) {
    const int8_t* row[R];
    const float* srow[R];
    for (int r = 0; r < R; ++r) {
      const int64_t nr = std::min(n + r, n1 - 1);
      row[r] = a.w + nr * K;
      srow[r] = a.scales + nr * groups;
    }
    __m512 total[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) total[i][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i part[MT][R], wsum[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        wsum[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) part[i][r] = _mm512_setzero_si512();
      }
      for (int64_t k = g * G; k < (g + 1) * G; k += 64) {
        const __mmask64 live = (g + 1) * G - k >= 64 ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
        __m512i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          wv[r] = _mm512_maskz_loadu_epi8(live, row[r] + k);
          wsum[r] = dpbusd(wsum[r], ones, wv[r]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m512i xv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(live, d.xq + (m0 + i) * K + k), sign);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) part[i][r] = dpbusd(part[i][r], xv, wv[r]);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const float xs = d.xs[(m0 + i) * groups + g];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          // Masked-off lanes added 128 * 0 to part and 0 to wsum: the correction is exact.
          const __m512i exact = _mm512_sub_epi32(part[i][r], _mm512_slli_epi32(wsum[r], 7));
          total[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(srow[r][g] * xs), total[i][r]);
        }
      }
    }
    for (int r = 0; r < R && n + r < n1; ++r) {
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(_mm512_reduce_add_ps(total[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

}  // namespace

void gemv_int8_dot_avx512_vnni(const Int8DotArgs& d, int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + 8 <= d.a->M; m += 8) dot_tile<8, 1>(d, m, n0, n1);
  for (; m + 4 <= d.a->M; m += 4) dot_tile<4, 2>(d, m, n0, n1);
  for (; m + 2 <= d.a->M; m += 2) dot_tile<2, 4>(d, m, n0, n1);
  for (; m < d.a->M; ++m) dot_tile<1, 8>(d, m, n0, n1);
}

namespace {

// The weight-only GEMV's VNNI form. x is carried as 16-bit fixed point per group (scale =
// max|x| / 32767, so each value is off by at most 2^-16 of its group's largest: 256 times
// finer than bf16's rounding), the int8 weights are widened to int16 (vpmovsxbw, 32 per
// instruction) and vpdpwssd adds 32 exact products per instruction into int32 lanes; a
// group's sum is converted and scaled once. Per 32 weights and row of x that is 2
// instructions where the f32 kernel above needs 6 (widen to int32, convert, FMA, twice):
// 1.3-1.5x its speed from 8 rows of x on; at batch 1 both read about 0.8 of the bf16
// GEMV's bytes per second (bench/linear_int8_bench.cc; tiles of 16 weight rows, as the
// bf16 GEMV uses, measured slower here: docs/quantization.md). Lanes cannot overflow: a group of at most 256 puts 16 pairs
// of |q| <= 127 times |x| <= 32767 into a lane, 6.7e7 < 2^31.
template <int MT, int R>
TESSERA_TARGET_AVX512_VNNI void x16_tile(const Int16XArgs& d, int64_t m0, int64_t n0, int64_t n1) {
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
    __m512 total[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) total[i][r] = _mm512_setzero_ps();
    // The next tile's rows (contiguous after this tile's) are prefetched R/2 lines per
    // 32-byte step, so they arrive as this tile ends: rows of 768-5632 int8 weights are too
    // short for the hardware prefetchers to ramp up on. Batch-1 decode, int8, same rounds:
    // ~100M 152-157 -> 173-198 tok/s, ~1.1B 18.5-21.3 -> 23.7-30.4 (docs/quantization.md).
    const char* ahead = n + 2 * R <= n1 ? reinterpret_cast<const char*>(a.w + (n + R) * K) : nullptr;
    for (int64_t g = 0; g < groups; ++g) {
      __m512i part[MT][R];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) part[i][r] = _mm512_setzero_si512();
      for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
        if (ahead != nullptr) {
#pragma GCC unroll 8
          for (int j = 0; j < R / 2; ++j) _mm_prefetch(ahead + k * R + j * 64, _MM_HINT_T0);
        }
        __m512i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          wv[r] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + k)));
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m512i xv = _mm512_loadu_si512(d.xq + (m0 + i) * K + k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) part[i][r] = dpwssd(part[i][r], xv, wv[r]);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const float xs = d.xs[(m0 + i) * groups + g];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          total[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(part[i][r]), _mm512_set1_ps(srow[r][g] * xs), total[i][r]);
      }
    }
    for (int r = 0; r < R && n + r < n1; ++r) {
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(_mm512_reduce_add_ps(total[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

}  // namespace

// Tiles of at most 4 rows of x: an 8 x 1 tile streams a single weight row, too few DRAM
// streams and none prefetched (R / 2 = 0 lines), and measured 1.9 ms against 1.2 for two
// passes of 4 x 2 at M = 8 (4096 x 4096, bench/linear_int8_bench.cc); 8 x 2 needs more
// than the 32 registers. The second pass reads the chunk's rows from L2.
void gemv_int8_x16_avx512_vnni(const Int16XArgs& d, int64_t n0, int64_t n1) {
  int64_t m = 0;
  for (; m + 4 <= d.a->M; m += 4) x16_tile<4, 2>(d, m, n0, n1);
  for (; m + 2 <= d.a->M; m += 2) x16_tile<2, 4>(d, m, n0, n1);
  for (; m < d.a->M; ++m) x16_tile<1, 8>(d, m, n0, n1);
}

namespace {

// One f32 row to Q's fixed point per group: scale = max|x| / kMax, q = x / scale rounded half
// to even and clamped to +-kMax (quantize_int8's rule with kMax = 127, so the same bytes;
// 32767 for the 16-bit x of the VNNI kernels), 16 lanes at a time: decode quantizes one row
// per call, prefill hundreds. Tests rebuild both in scalar code.
template <typename Q>
TESSERA_TARGET_AVX512 void quantize_row_avx512(const float* x, int64_t K, int64_t group, Q* q, float* scales) {
  constexpr float kMax = sizeof(Q) == 1 ? 127.0f : 32767.0f;
  const __m512 lo = _mm512_set1_ps(-kMax), hi = _mm512_set1_ps(kMax);
  for (int64_t g = 0; g < K / group; ++g) {
    const float* xg = x + g * group;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t k = 0; k < group; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xg + k)));
    const float scale = _mm512_reduce_max_ps(amax) / kMax;
    scales[g] = scale;
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t k = 0; k < group; k += 16) {
      __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(xg + k), s),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
      if (scale == 0.0f) v = _mm512_setzero_ps();
      const __m512i i32 = _mm512_cvtps_epi32(v);
      if constexpr (sizeof(Q) == 1) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * group + k), _mm512_cvtsepi32_epi8(i32));
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * group + k), _mm512_cvtsepi32_epi16(i32));
      }
    }
  }
}

}  // namespace

void quantize_row_int16_avx512(const float* x, int64_t K, int64_t group, int16_t* q, float* scales) {
  quantize_row_avx512(x, K, group, q, scales);
}

void quantize_row_int8_avx512(const float* x, int64_t K, int64_t group, int8_t* q, float* scales) {
  quantize_row_avx512(x, K, group, q, scales);
}

bool cpu_has_avx512_vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return detected_cpu_isa() == CpuIsa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}

}  // namespace tessera::cpu::detail
