// AVX-512 flavour of the int8 linear kernels: the AVX2 scheme (linear_int8_avx2.cc) with 16
// lanes (vpmovsxbd zmm from 16 bytes) and 32 registers, so tiles of (8, 1), (4, 2), (2, 4)
// and (1, 8) rows of x x weight rows. Not run on the development machine (an AVX2-only
// EPYC); tests/kernels/linear_int8_test.cc runs it wherever the CPU has AVX-512.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/linear_int8_kernels.h"

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
