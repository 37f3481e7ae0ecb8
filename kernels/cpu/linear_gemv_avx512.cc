// AVX-512 flavour of the linear kernels (needs F + BW + VL; F16C/FMA come with it).
// Decode is memory bound: the kernel's job is to keep the weight stream flowing, so every
// weight is loaded once per tile of up to 8 x rows, widened to f32 in a register and used
// for one FMA per x row. K tails use masked loads, so there is no scalar remainder loop.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/linear_kernels.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_* is "maybe uninitialized" by
// design: those lanes are overwritten); the warning says nothing about this file.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TESSERA_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

// 16 weights starting at element i of `w`, widened to f32. Masked lanes read as 0.
template <DType D, bool kMasked>
TESSERA_TARGET_AVX512 inline __m512 load_w16(const void* w, int64_t i, __mmask16 mask) {
  if constexpr (D == DType::kF32) {
    const float* p = static_cast<const float*>(w) + i;
    return kMasked ? _mm512_maskz_loadu_ps(mask, p) : _mm512_loadu_ps(p);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(w) + i;
    __m256i h = kMasked ? _mm256_maskz_loadu_epi16(mask, p)
                        : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (D == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {  // bf16 is the top half of an f32
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// MT rows of x (from m0) against weight rows [n0, n1), R weight rows at a time. The last
// group re-reads row n1-1 for its missing rows and discards those sums (no scalar tail).
template <DType D, int MT, int R>
TESSERA_TARGET_AVX512 void gemv_tile(const LinearArgs& a, int64_t m0, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  const float* xr[MT];
  for (int i = 0; i < MT; ++i) xr[i] = a.x + (m0 + i) * a.ldx;
  const int64_t k_main = K & ~int64_t{15};
  const __mmask16 tail_mask = static_cast<__mmask16>((1u << (K - k_main)) - 1u);

  for (int64_t n = n0; n < n1; n += R) {
    int64_t row[R];
    for (int r = 0; r < R; ++r) row[r] = std::min(n + r, n1 - 1) * K;
    __m512 acc[MT][R];
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < k_main; k += 16) {
      __m512 wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = load_w16<D, false>(a.w, row[r] + k, 0);
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        __m512 xv = _mm512_loadu_ps(xr[i] + k);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[i][r] = _mm512_fmadd_ps(wv[r], xv, acc[i][r]);
      }
    }
    if (k_main < K) {
      __m512 wv[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = load_w16<D, true>(a.w, row[r] + k_main, tail_mask);
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        __m512 xv = _mm512_maskz_loadu_ps(tail_mask, xr[i] + k_main);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[i][r] = _mm512_fmadd_ps(wv[r], xv, acc[i][r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (n + r >= n1) break;
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] =
            finish_output(_mm512_reduce_add_ps(acc[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

// bf16 without shuffles: a 64-byte load holds 32 weights; shifting each 32-bit lane left by
// 16 gives the even-indexed weights as f32, masking off the low half gives the odd ones.
// Two cheap ALU ops per 32 weights instead of two cross-lane widenings per 16, which is
// what bounded the plain bf16 kernel on matrices a few thousand wide. x is split once per
// call into the matching even/odd order (`xd`: per 32-element block, 16 evens then 16 odds,
// zero padded), so the sums are the same products in a different order.
// One 32-weight step of gemv_tile_bf16_pairs for R weight rows and MT x rows.
template <int MT, int R>
TESSERA_TARGET_AVX512 inline __attribute__((always_inline)) void bf16_pairs_step(
    const __m512i* raw, const float* xd, int64_t kd, int64_t k, __m512i odd_mask, __m512 (*acc)[R]) {
  __m512 even[R], odd[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    even[r] = _mm512_castsi512_ps(_mm512_slli_epi32(raw[r], 16));
    odd[r] = _mm512_castsi512_ps(_mm512_and_si512(raw[r], odd_mask));
  }
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) {
    const __m512 xe = _mm512_loadu_ps(xd + i * kd + k);
    const __m512 xo = _mm512_loadu_ps(xd + i * kd + k + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      acc[i][r] = _mm512_fmadd_ps(even[r], xe, acc[i][r]);
      acc[i][r] = _mm512_fmadd_ps(odd[r], xo, acc[i][r]);
    }
  }
}

template <int MT, int R>
TESSERA_TARGET_AVX512 void gemv_tile_bf16_pairs(const LinearArgs& a, int64_t m0, int64_t n0, int64_t n1,
                                                const float* xd, int64_t kd) {
  const int64_t K = a.K;
  const int64_t k_main = K & ~int64_t{31};
  const __mmask32 tail_mask = static_cast<__mmask32>((uint64_t{1} << (K - k_main)) - 1u);
  const __m512i odd_mask = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  for (int64_t n = n0; n < n1; n += R) {
    const uint16_t* row[R];
    for (int r = 0; r < R; ++r) row[r] = w + std::min(n + r, n1 - 1) * K;
    __m512 acc[MT][R];
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < k_main; k += 32) {
      __m512i raw[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) raw[r] = _mm512_loadu_si512(row[r] + k);
      bf16_pairs_step<MT, R>(raw, xd, kd, k, odd_mask, acc);
    }
    if (k_main < K) {
      __m512i raw[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) raw[r] = _mm512_maskz_loadu_epi16(tail_mask, row[r] + k_main);
      bf16_pairs_step<MT, R>(raw, xd, kd, k_main, odd_mask, acc);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (n + r >= n1) break;
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(_mm512_reduce_add_ps(acc[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

// Splits rows [m0, m0 + mt) of x into the even/odd block order gemv_tile_bf16_pairs reads.
inline void split_even_odd(const LinearArgs& a, int64_t m0, int64_t mt, std::vector<float>& xd, int64_t* kd) {
  *kd = (a.K + 31) & ~int64_t{31};
  xd.assign(static_cast<size_t>(mt * *kd), 0.0f);
  for (int64_t i = 0; i < mt; ++i) {
    const float* x = a.x + (m0 + i) * a.ldx;
    float* d = xd.data() + i * *kd;
    for (int64_t k = 0; k < a.K; ++k) {
      const int64_t block = k & ~int64_t{31}, j = k - block;
      d[block + (j & 1) * 16 + (j >> 1)] = x[k];
    }
  }
}

template <int MT>
TESSERA_TARGET_AVX512 void gemv_bf16_pairs_for(const LinearArgs& a, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int R = MT == 1 ? 8 : (MT == 2 ? 4 : 2);
  thread_local std::vector<float> xd;
  int64_t kd = 0;
  split_even_odd(a, m0, MT, xd, &kd);
  gemv_tile_bf16_pairs<MT, R>(a, m0, n0, n1, xd.data(), kd);
}

// Weight rows per group. From two rows of x on, more rows share each x load among more
// weight loads, bounded by keeping the MT*R accumulators in zmm registers. One row of x has no
// x loads worth sharing, and reads its weight rows one after another: each thread's chunk is
// then one sequential stream, where rows side by side split it. ~100M f32 batch-1 decode
// 1.04-1.47x against 16 rows side by side (tessera-bench, ABBA rounds, 2-core AMD EPYC,
// 2026-12-07; linear_gemv_bf16_dot.cc says why linear_bench is not the measure here).
template <DType D, int MT>
TESSERA_TARGET_AVX512 void gemv_tile_for(const LinearArgs& a, int64_t m0, int64_t n0,
                                         int64_t n1) {
  constexpr int R = MT == 1 ? 1 : (MT == 2 ? 8 : (MT <= 4 ? 4 : 2));
  gemv_tile<D, MT, R>(a, m0, n0, n1);
}

template <DType D>
TESSERA_TARGET_AVX512 void gemv_typed(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0,
                                      int64_t n1) {
  if constexpr (D == DType::kBF16) {
    // Batch 1 and 2 with rows up to 2048 wide take the shuffle-free even/odd kernel: there
    // the widening, not DRAM, bounded the plain kernel (768x768: 32 -> 41 GB/s). On wider
    // rows the plain kernel's 16 concurrent row streams win (4096x4096: 51 vs 41 GB/s).
    if (m1 - m0 <= 2 && a.K <= 2048) {
      if (m1 - m0 == 1) {
        gemv_bf16_pairs_for<1>(a, m0, n0, n1);
      } else {
        gemv_bf16_pairs_for<2>(a, m0, n0, n1);
      }
      return;
    }
  }
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

TESSERA_TARGET_AVX512 void gemv_avx512(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0,
                                       int64_t n1) {
  switch (a.w_dtype) {
    case DType::kF32: gemv_typed<DType::kF32>(a, m0, m1, n0, n1); break;
    case DType::kF16: gemv_typed<DType::kF16>(a, m0, m1, n0, n1); break;
    default: gemv_typed<DType::kBF16>(a, m0, m1, n0, n1); break;
  }
}

TESSERA_TARGET_AVX512 void widen_avx512(const uint16_t* src, DType src_dtype, float* dst,
                                        int64_t n) {
  int64_t i = 0;
  if (src_dtype == DType::kF16) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_w16<DType::kF16, false>(src, i, 0));
  } else {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_w16<DType::kBF16, false>(src, i, 0));
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 v = src_dtype == DType::kF16 ? load_w16<DType::kF16, true>(src, i, mask)
                                        : load_w16<DType::kBF16, true>(src, i, mask);
    _mm512_mask_storeu_ps(dst + i, mask, v);
  }
}

}  // namespace tessera::cpu::detail
