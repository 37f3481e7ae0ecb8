// AVX2 + FMA + F16C pieces of the packed GEMM (gemm_packed.h): the 6 x 16 micro-kernel and
// the panel packer whose layout it reads.
//
// Register budget (16 ymm): 12 accumulators (6 rows x 2 vectors of 8 columns), 2 widened
// weight vectors, 1 broadcast of x. A k step is 2 weight loads (or 1 for bf16), 6
// broadcasts from L1 and 12 FMAs, so both FMA pipes stay fed.
//
// Panel order per k step (16 values):
//  - f32, f16: columns 0..15 in order;
//  - bf16: column j at position 2j for j < 8 and 2(j-8)+1 for j >= 8, so one 32-byte load
//    yields columns 0..7 by shifting each 32-bit lane left 16 and columns 8..15 by masking
//    off its low half (bf16 is the top half of an f32).
// The packer transposes 8 k steps of 16 rows at a time with unpack/shuffle sequences.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/transpose_avx2.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

constexpr int kMr = kAvx2Mr;
constexpr int kNr = kAvx2Nr;

// The 16 weights of one k step, widened: columns 0..7 in *lo, 8..15 in *hi.
template <PanelFormat F>
TESSERA_TARGET_AVX2 inline __attribute__((always_inline)) void load_step(const void* panel, int64_t k, __m256* lo,
                                                                         __m256* hi) {
  if constexpr (F == PanelFormat::kF32) {
    const float* p = static_cast<const float*>(panel) + k * kNr;
    *lo = _mm256_loadu_ps(p);
    *hi = _mm256_loadu_ps(p + 8);
  } else if constexpr (F == PanelFormat::kF16) {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kNr;
    *lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kNr;
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u))));
  }
}

template <PanelFormat F>
TESSERA_TARGET_AVX2 void microkernel(const float* xp, const void* panel, int64_t kc, float* c, int64_t ldc,
                                     bool accumulate) {
  __m256 acc[kMr][2];
  if (accumulate) {
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      acc[i][0] = _mm256_loadu_ps(c + i * ldc);
      acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
    }
  } else {
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  }
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __m256 lo, hi;
    load_step<F>(panel, k, &lo, &hi);
    const float* xk = xp + k * kMr;
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      const __m256 b = _mm256_broadcast_ss(xk + i);
      acc[i][0] = _mm256_fmadd_ps(b, lo, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(b, hi, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

// f32 panel: dst[k * stride + j] = row_j[k].
TESSERA_TARGET_AVX2 void pack_f32(const float* const rows[kNr], int64_t kc, float* dst, int64_t stride) {
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    for (int half = 0; half < 2; ++half) {
      __m256 r[8], out[8];
      for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(rows[half * 8 + j] + k);
      transpose8x8(r, out);
      for (int s = 0; s < 8; ++s) _mm256_storeu_ps(dst + (k + s) * stride + half * 8, out[s]);
    }
  }
  for (; k < kc; ++k) {
    for (int j = 0; j < kNr; ++j) dst[k * stride + j] = rows[j][k];
  }
}

// 16-bit panel in which 32-bit word i of a k step is (lo_i[k], hi_i[k]) (low half first):
// f16 pairs rows (2i, 2i+1) (columns in order), bf16 pairs rows (i, i+8) (the even/odd
// order). Per 8 k steps: interleave each pair's 8 values into words for k 0..3 and 4..7,
// then transpose 4 x 4 blocks of words into per-k vectors.
TESSERA_TARGET_AVX2 void pack_16bit_pairs(const uint16_t* const lo[8], const uint16_t* const hi[8], int64_t kc,
                                          uint16_t* dst, int64_t stride) {
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m128i first[8], second[8];  // words of pair i for k..k+3 and k+4..k+7
    for (int i = 0; i < 8; ++i) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo[i] + k));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi[i] + k));
      first[i] = _mm_unpacklo_epi16(a, b);
      second[i] = _mm_unpackhi_epi16(a, b);
    }
    for (int part = 0; part < 2; ++part) {
      const __m128i* w = part == 0 ? first : second;
      __m128i t[2][4];  // t[g][s]: words of pairs 4g..4g+3 at k step (k + 4 * part + s)
      for (int g = 0; g < 2; ++g) {
        const __m128i a0 = _mm_unpacklo_epi32(w[4 * g], w[4 * g + 1]), a1 = _mm_unpackhi_epi32(w[4 * g], w[4 * g + 1]);
        const __m128i a2 = _mm_unpacklo_epi32(w[4 * g + 2], w[4 * g + 3]), a3 = _mm_unpackhi_epi32(w[4 * g + 2], w[4 * g + 3]);
        t[g][0] = _mm_unpacklo_epi64(a0, a2);
        t[g][1] = _mm_unpackhi_epi64(a0, a2);
        t[g][2] = _mm_unpacklo_epi64(a1, a3);
        t[g][3] = _mm_unpackhi_epi64(a1, a3);
      }
      for (int s = 0; s < 4; ++s) {
        const __m256i v = _mm256_set_m128i(t[1][s], t[0][s]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (k + 4 * part + s) * stride), v);
      }
    }
  }
  for (; k < kc; ++k) {
    for (int i = 0; i < 8; ++i) {
      dst[k * stride + 2 * i] = lo[i][k];
      dst[k * stride + 2 * i + 1] = hi[i][k];
    }
  }
}

}  // namespace

TESSERA_TARGET_AVX2 void microkernel_avx2(PanelFormat format, const float* xp, const void* panel, int64_t kc, float* c,
                                          int64_t ldc, bool accumulate) {
  switch (format) {
    case PanelFormat::kF32: microkernel<PanelFormat::kF32>(xp, panel, kc, c, ldc, accumulate); break;
    case PanelFormat::kF16: microkernel<PanelFormat::kF16>(xp, panel, kc, c, ldc, accumulate); break;
    case PanelFormat::kBF16: microkernel<PanelFormat::kBF16>(xp, panel, kc, c, ldc, accumulate); break;
    case PanelFormat::kBF16Pairs: __builtin_trap();  // AVX-512 BF16 only; gemm_packed.cc never picks it here
  }
}

TESSERA_TARGET_AVX2 void pack_panel_avx2(const WeightSource& source, PanelFormat format, int64_t n0, int64_t k0,
                                         int64_t kc, void* dst, int64_t dst_stride) {
  // Rows past N read a zero row, so the padded columns of the last panel compute zeros.
  thread_local std::vector<uint32_t> zeros;
  if (static_cast<int64_t>(zeros.size()) < kc) zeros.assign(static_cast<size_t>(kc), 0u);
  const int64_t elem = panel_element_bytes(format);
  const char* base = static_cast<const char*>(source.w);
  const void* rows[kNr];
  for (int j = 0; j < kNr; ++j) {
    rows[j] = n0 + j < source.N ? base + ((n0 + j) * source.K + k0) * elem : static_cast<const void*>(zeros.data());
  }
  if (format == PanelFormat::kF32) {
    const float* r[kNr];
    for (int j = 0; j < kNr; ++j) r[j] = static_cast<const float*>(rows[j]);
    pack_f32(r, kc, static_cast<float*>(dst), dst_stride);
    return;
  }
  const uint16_t* lo[8];
  const uint16_t* hi[8];
  for (int i = 0; i < 8; ++i) {
    const bool bf16 = format == PanelFormat::kBF16;
    lo[i] = static_cast<const uint16_t*>(rows[bf16 ? i : 2 * i]);
    hi[i] = static_cast<const uint16_t*>(rows[bf16 ? i + 8 : 2 * i + 1]);
  }
  pack_16bit_pairs(lo, hi, kc, static_cast<uint16_t*>(dst), dst_stride);
}

}  // namespace tessera::cpu::detail
