// AVX2 + FMA + F16C flavour of the linear kernels, for x86-64 CPUs without AVX-512.
// Same scheme as linear_gemv_avx512.cc with 8-wide vectors and only 16 registers, so fewer
// accumulators per tile. K tails: masked loads for f32; f16/bf16 tails go through a small
// zero-padded buffer (AVX2 has no 16-bit masked load).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/linear_kernels.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

// 8 weights from p (a pointer to the element), widened to f32.
template <DType D>
TESSERA_TARGET_AVX2 inline __m256 load_w8(const void* p) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else {
    __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    if constexpr (D == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {  // bf16 is the top half of an f32
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// The first `count` (< 8) weights from element i of w, widened; the other lanes are 0.
template <DType D>
TESSERA_TARGET_AVX2 inline __m256 load_w8_tail(const void* w, int64_t i, int64_t count,
                                               __m256i mask) {
  if constexpr (D == DType::kF32) {
    return _mm256_maskload_ps(static_cast<const float*>(w) + i, mask);
  } else {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, static_cast<const uint16_t*>(w) + i, count * sizeof(uint16_t));
    return load_w8<D>(tmp);
  }
}

template <DType D>
constexpr int64_t elem_size() {
  return D == DType::kF32 ? 4 : 2;
}

// MT rows of x (from m0) against weight rows [n0, n1), R weight rows at a time. The last
// group re-reads row n1-1 for its missing rows and discards those sums.
template <DType D, int MT, int R>
TESSERA_TARGET_AVX2 void gemv_tile(const LinearArgs& a, int64_t m0, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  const char* w = static_cast<const char*>(a.w);
  const float* xr[MT];
  for (int i = 0; i < MT; ++i) xr[i] = a.x + (m0 + i) * a.ldx;
  const int64_t k_main = K & ~int64_t{7};
  const int64_t tail = K - k_main;
  const __m256i tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(tail)),
                                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));

  for (int64_t n = n0; n < n1; n += R) {
    const char* row[R];
    for (int r = 0; r < R; ++r) row[r] = w + std::min(n + r, n1 - 1) * K * elem_size<D>();
    __m256 acc[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < k_main; k += 8) {
      __m256 wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = load_w8<D>(row[r] + k * elem_size<D>());
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        __m256 xv = _mm256_loadu_ps(xr[i] + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
      }
    }
    if (tail > 0) {
      __m256 wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = load_w8_tail<D>(row[r], k_main, tail, tail_mask);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        __m256 xv = _mm256_maskload_ps(xr[i] + k_main, tail_mask);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (n + r >= n1) break;
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[i][r]), _mm256_extractf128_ps(acc[i][r], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(_mm_cvtss_f32(s), a.bias, n + r, a.act);
      }
    }
  }
}

// Weight rows per group: as many DRAM streams as the 16 ymm registers allow (MT*R
// accumulators plus the weights and x being multiplied).
template <DType D, int MT>
TESSERA_TARGET_AVX2 void gemv_tile_for(const LinearArgs& a, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int R = MT == 1 ? 8 : (MT == 2 ? 4 : (MT <= 4 ? 2 : 1));
  gemv_tile<D, MT, R>(a, m0, n0, n1);
}

template <DType D>
TESSERA_TARGET_AVX2 void gemv_typed(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0,
                                    int64_t n1) {
  for (int64_t m = m0; m < m1; m += kGemvRowTile) {
    switch (std::min(kGemvRowTile, m1 - m)) {
      case 1: gemv_tile_for<D, 1>(a, m, n0, n1); break;
      case 2: gemv_tile_for<D, 2>(a, m, n0, n1); break;
      case 3: gemv_tile_for<D, 3>(a, m, n0, n1); break;
      case 4: gemv_tile_for<D, 4>(a, m, n0, n1); break;
      case 5: gemv_tile_for<D, 5>(a, m, n0, n1); break;
      case 6: gemv_tile_for<D, 6>(a, m, n0, n1); break;
      case 7: gemv_tile_for<D, 7>(a, m, n0, n1); break;
      default: gemv_tile_for<D, 8>(a, m, n0, n1); break;
    }
  }
}

}  // namespace

TESSERA_TARGET_AVX2 void gemv_avx2(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0,
                                   int64_t n1) {
  switch (a.w_dtype) {
    case DType::kF32: gemv_typed<DType::kF32>(a, m0, m1, n0, n1); break;
    case DType::kF16: gemv_typed<DType::kF16>(a, m0, m1, n0, n1); break;
    default: gemv_typed<DType::kBF16>(a, m0, m1, n0, n1); break;
  }
}

TESSERA_TARGET_AVX2 void widen_avx2(const uint16_t* src, DType src_dtype, float* dst, int64_t n) {
  int64_t i = 0;
  if (src_dtype == DType::kF16) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_w8<DType::kF16>(src + i));
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_w8<DType::kBF16>(src + i));
  }
  if (i < n) widen_scalar(src + i, src_dtype, dst + i, n - i);
}

}  // namespace tessera::cpu::detail
