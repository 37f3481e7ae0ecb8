// AVX-512 pieces of the packed GEMM (gemm_packed.h): the 8 x 32 micro-kernel and its
// panel packer.
//
// Register budget (32 zmm): 16 accumulators (8 rows x 2 vectors of 16 columns), 2 widened
// weight vectors, x broadcast straight from memory into the FMAs ({1to16} operands). A k
// step is 2 weight loads (1 for bf16), 8 broadcasts from L1 and 16 FMAs: twice the FMAs
// per step of the AVX2 kernel, and 16 independent chains cover the FMA latency of two pipes.
//
// Panel layout per k step (32 values): two AVX2 steps side by side, columns 0..15 then
// 16..31, so the AVX2 packer (transposes included) writes it with a stride of 32:
//  - f32, f16: columns in order; one vector per 16 columns (f16 widened by vcvtph2ps);
//  - bf16: each half in the AVX2 even/odd order, so 32-bit word i of the 64-byte step is
//    (column i, column i + 8) for i < 8 and (column 8 + i, column 16 + i) for i >= 8. One
//    shift gives columns {0..7, 16..23} and one AND {8..15, 24..31}; the tile is stored (and
//    reloaded) through a 128-bit-lane shuffle that puts the columns back in order.
// Every output is still one ascending-k chain of FMAs, bit-identical to the AVX2 kernel.
#include <immintrin.h>

#include "kernels/cpu/gemm_packed.h"

// GCC 12's _mm512_undefined_ps (inside _mm512_cvtph_ps, _mm512_shuffle_f32x4) initialises a
// register from itself on purpose, which its own -Wuninitialized then reports.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TESSERA_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TESSERA_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

constexpr int kMr = kAvx512Mr;
constexpr int kNr = kAvx512Nr;

// The 32 weights of one k step, widened into two vectors (which columns each holds: above).
template <PanelFormat F>
TESSERA_TARGET_AVX512 inline __attribute__((always_inline)) void load_step(const void* panel, int64_t k, __m512* a,
                                                                           __m512* b) {
  if constexpr (F == PanelFormat::kF32) {
    const float* p = static_cast<const float*>(panel) + k * kNr;
    *a = _mm512_loadu_ps(p);
    *b = _mm512_loadu_ps(p + 16);
  } else if constexpr (F == PanelFormat::kF16) {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kNr;
    *a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    *b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kNr;
    const __m512i raw = _mm512_loadu_si512(p);
    *a = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    *b = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
  }
}

// Between a row of the tile in column order (c0 = columns 0..15, c1 = 16..31) and the bf16
// kernel's accumulator order (a = {0..7, 16..23}, b = {8..15, 24..31}). The same two
// shuffles go either way.
TESSERA_TARGET_AVX512 inline void swap_bf16_halves(__m512 in0, __m512 in1, __m512* out0, __m512* out1) {
  *out0 = _mm512_shuffle_f32x4(in0, in1, 0x44);  // in0 lanes 0-7, in1 lanes 0-7
  *out1 = _mm512_shuffle_f32x4(in0, in1, 0xEE);  // in0 lanes 8-15, in1 lanes 8-15
}

template <PanelFormat F>
TESSERA_TARGET_AVX512 void microkernel(const float* xp, const void* panel, int64_t kc, float* c, int64_t ldc,
                                       bool accumulate) {
  __m512 acc[kMr][2];
  if (accumulate) {
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512 c0 = _mm512_loadu_ps(c + i * ldc), c1 = _mm512_loadu_ps(c + i * ldc + 16);
      if constexpr (F == PanelFormat::kBF16) {
        swap_bf16_halves(c0, c1, &acc[i][0], &acc[i][1]);
      } else {
        acc[i][0] = c0;
        acc[i][1] = c1;
      }
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  }
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __m512 a, b;
    load_step<F>(panel, k, &a, &b);
    const float* xk = xp + k * kMr;
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512 x = _mm512_set1_ps(xk[i]);
      acc[i][0] = _mm512_fmadd_ps(x, a, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(x, b, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    __m512 c0 = acc[i][0], c1 = acc[i][1];
    if constexpr (F == PanelFormat::kBF16) swap_bf16_halves(acc[i][0], acc[i][1], &c0, &c1);
    _mm512_storeu_ps(c + i * ldc, c0);
    _mm512_storeu_ps(c + i * ldc + 16, c1);
  }
}

// bf16 x bf16 pairs: per pair of k, two panel loads (columns 0..15 and 16..31, in order:
// the f32 packer wrote the 32-bit words) and one vdpbf16ps per row and vector, which adds
// both products of the pair to the f32 accumulator.
TESSERA_TARGET_AVX512_BF16 void microkernel_bf16_pairs(const float* xp, const void* panel, int64_t kc, float* c,
                                                       int64_t ldc, bool accumulate) {
  const auto* x = reinterpret_cast<const uint32_t*>(xp);
  const auto* w = static_cast<const uint32_t*>(panel);
  __m512 acc[kMr][2];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    acc[i][0] = accumulate ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
    acc[i][1] = accumulate ? _mm512_loadu_ps(c + i * ldc + 16) : _mm512_setzero_ps();
  }
#pragma GCC unroll 2
  for (int64_t kp = 0; kp < kc / 2; ++kp) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + kp * kNr);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + kp * kNr + 16);
    const uint32_t* xk = x + kp * kMr;
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(xk[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xv, w0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xv, w1);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}

}  // namespace

TESSERA_TARGET_AVX512 void microkernel_avx512(PanelFormat format, const float* xp, const void* panel, int64_t kc,
                                              float* c, int64_t ldc, bool accumulate) {
  switch (format) {
    case PanelFormat::kF32: microkernel<PanelFormat::kF32>(xp, panel, kc, c, ldc, accumulate); break;
    case PanelFormat::kF16: microkernel<PanelFormat::kF16>(xp, panel, kc, c, ldc, accumulate); break;
    case PanelFormat::kBF16: microkernel<PanelFormat::kBF16>(xp, panel, kc, c, ldc, accumulate); break;
    case PanelFormat::kBF16Pairs: microkernel_bf16_pairs(xp, panel, kc, c, ldc, accumulate); break;
  }
}

void pack_panel_avx512(const WeightSource& source, PanelFormat format, int64_t n0, int64_t k0, int64_t kc,
                       void* dst) {
  if (format == PanelFormat::kBF16Pairs) {
    // A bf16 row of K values is a row of K / 2 32-bit words: the f32 packer's transposes
    // put each (k, k + 1) pair of a column in one word of the panel.
    const WeightSource words{source.w, DType::kF32, source.N, source.K / 2};
    pack_panel_avx2(words, PanelFormat::kF32, n0, k0 / 2, kc / 2, dst, kNr);
    pack_panel_avx2(words, PanelFormat::kF32, n0 + kAvx2Nr, k0 / 2, kc / 2, static_cast<char*>(dst) + kAvx2Nr * 4,
                    kNr);
    return;
  }
  const int64_t half_bytes = kAvx2Nr * panel_element_bytes(format);
  pack_panel_avx2(source, format, n0, k0, kc, dst, kNr);
  pack_panel_avx2(source, format, n0 + kAvx2Nr, k0, kc, static_cast<char*>(dst) + half_bytes, kNr);
}

}  // namespace tessera::cpu::detail
