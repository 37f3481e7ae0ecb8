// The int8 linear layer's GEMM (M above the GEMV's rows: prefill, batched decode) on CPUs
// with AVX-512 VNNI, in three forms:
//  - 16-bit x on row-major int8 (weight-only): x in 16-bit fixed point per group (as the VNNI
//    GEMV, linear_int8_kernels.h), int8 weights widened to int16 as they are packed, and
//    vpdpwssd, which adds 32 exact products per instruction where an f32 FMA adds 16. The
//    f32 path it replaces (gemm_packed_int8: weights dequantized to f32 panels per call, f32
//    micro-kernel) ran batch 32 at 0.65-0.70 of bf16's speed (bench/linear_int8_bench.cc).
//  - 8-bit x (int8 activations, CpuKernelOptions::int8_dot): x quantized per group by the
//    weights' rule and vpdpbusd, 64 products per instruction. It multiplies unsigned by
//    signed bytes, so the weights are packed offset by 128 (an XOR of the sign bit) and x
//    stays signed: sum((w + 128) x) = sum(w x) + 128 sum(x), and 128 sum(x) of each row and
//    group (computed as x is packed) is taken off at the group's end. 1.4-1.6x bf16 at
//    8-256 rows here (docs/quantization.md).
//
//  - 16-bit x on persistent panels (linear_int8_panels.h, the default on these CPUs): the
//    weights were laid out at load time as the 16-bit form's panels hold them, but still in
//    int8 (pairs of k per column), so nothing is packed per call: the micro-kernel widens
//    each step's 64 bytes itself (two vpmovsxbw per 16 vpdpwssd). Packing the int8 rows cost
//    as much as the products at 8 rows and a third of the time at 32.
//
// Blocking as gemm_packed.cc (threads split 32-column panels; a chunk of 8 panels x one K
// block stays in L2 while every 8-row tile of x passes over it), with one difference: a K
// block is a whole number of quantization groups, since the integer sums of a group are
// converted and scaled (weight scale x x scale) once at the group's end.
//
// Layouts, per K block of kc values (a multiple of 32), with P = 2 (16-bit x) or 4 (8-bit):
//  - panel: kc / P steps of 32 int32 words, word j = w[k .. k + P)[col j] (int16, or
//    offset uint8); then kc / group rows of 32 f32 weight scales (0 for columns past N);
//  - x tile: K / P steps of 8 words (x[row i][k .. k + P)); x scales [groups][8] and, for
//    8-bit x, 128 x sum(x) [groups][8] (0 for rows past M).
// Accumulators: 8 rows x 2 vectors of int32 (16 zmm) per group; the f32 tile of y lives in
// an L1-resident 8 x 32 buffer between groups.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/linear_int8_kernels.h"
#include "kernels/cpu/next_block_prefetcher.h"
#include "kernels/cpu/vnni_asm.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_* is "maybe uninitialized" by
// design: those lanes are overwritten); the warning says nothing about this file.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // the same, as -O1 (the sanitizer build) words it
#endif

#define TESSERA_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

namespace tessera::cpu::detail {
namespace {

constexpr int kMr = 8, kNr = 32;
// k values per 32-bit word of a panel or x tile: pairs of int16 (vpdpwssd) or quads of
// int8 (vpdpbusd).
constexpr int k_per_word(int x_bits) { return x_bits == 16 ? 2 : 4; }
constexpr int64_t kChunkPanels = 8;

// K block: the whole groups that fit in ~target k (at least one group).
int64_t block_k(int64_t group, int64_t target) { return group * std::max<int64_t>(1, target / group); }
// Panels packed per call: ~256 k per block.
constexpr int64_t kPackedBlockK = 256;
// Persistent panels hold a K block in a quarter of the bytes a packed one takes (int8 pairs,
// no copy): blocks of ~1024 k keep a chunk of 8 panels at 256 KiB of L2, and the 8 x 32 tile
// of y goes through memory a quarter as often.
constexpr int64_t kPersistentBlockK = 1024;

// A 16 x 16 matrix of 32-bit words transposed in registers (unpacks within 128-bit lanes,
// then two rounds of lane shuffles).
TESSERA_TARGET_AVX512_VNNI inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8) {
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(u[h + i], u[h + 4 + i], 0x88);
      t[h + 4 + i] = _mm512_shuffle_i32x4(u[h + i], u[h + 4 + i], 0xdd);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
  }
}

// Panel of columns [n0, n0 + 32), k in [k0, k0 + kc): words, then scales (layout above).
// 16 columns x 16 words at a time, then a transpose turns columns into steps. 16-bit x:
// 32 int8 of a column widen to 16 words (vpmovsxbw puts k in the low half, k + 1 in the
// high). 8-bit x: 64 int8 of a column are 16 words as they are, offset to unsigned (an XOR
// of the sign bit); a block's last steps may be fewer than 16 (kc a multiple of 32).
template <int kBits>
TESSERA_TARGET_AVX512_VNNI void pack_panel(const Int8LinearArgs& a, int64_t n0, int64_t k0, int64_t kc, uint32_t* dst) {
  constexpr int kPer = k_per_word(kBits);
  const int64_t groups = a.K / a.group, block_groups = kc / a.group, steps = kc / kPer;
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    const int8_t* col[16];
    for (int j = 0; j < 16; ++j) {
      const int64_t n = n0 + 16 * h + j;
      col[j] = n < a.N ? a.w + n * a.K + k0 : nullptr;
    }
    for (int64_t p0 = 0; p0 < steps; p0 += 16) {
      const int64_t live = std::min<int64_t>(16, steps - p0);
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        if constexpr (kBits == 16) {
          r[j] = col[j] ? _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col[j] + 2 * p0)))
                        : _mm512_setzero_si512();
        } else {
          // Columns past N are weights 0, i.e. 0x80 once offset.
          const __mmask64 mask = live == 16 ? ~__mmask64{0} : (__mmask64{1} << (4 * live)) - 1;
          r[j] = _mm512_xor_si512(col[j] ? _mm512_maskz_loadu_epi8(mask, col[j] + 4 * p0) : _mm512_setzero_si512(), sign);
        }
      }
      transpose16(r);
      for (int64_t p = 0; p < live; ++p) _mm512_storeu_si512(dst + (p0 + p) * kNr + 16 * h, r[p]);
    }
  }
  float* scales = reinterpret_cast<float*>(dst + steps * kNr);
  for (int j = 0; j < kNr; ++j) {
    const int64_t n = n0 + j;
    for (int64_t g = 0; g < block_groups; ++g)
      scales[g * kNr + j] = n < a.N ? a.scales[n * groups + k0 / a.group + g] : 0.0f;
  }
}

// x quantized per row, then packed per 8-row tile (layout above).
template <int kBits>
void pack_x(const Int8LinearArgs& a, int64_t tiles, uint32_t* xp, float* xs, int32_t* xc) {
  constexpr int kPer = k_per_word(kBits);
  using Q = std::conditional_t<kBits == 16, int16_t, int8_t>;
  using U = std::conditional_t<kBits == 16, uint16_t, uint8_t>;
  const int64_t groups = a.K / a.group, steps = a.K / kPer;
#pragma omp parallel if (a.M * a.K >= 64 * 1024)
  {
    thread_local std::vector<Q> row_buffer;
    thread_local std::vector<float> scale_buffer;
    Q* q = scratch(row_buffer, a.K);
    float* s = scratch(scale_buffer, groups);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      for (int i = 0; i < kMr; ++i) {
        const int64_t m = t * kMr + i;
        uint32_t* dst = xp + t * steps * kMr;
        float* sdst = xs + t * groups * kMr;
        int32_t* cdst = xc + t * groups * kMr;
        if (m < a.M) {
          if constexpr (kBits == 16) {
            quantize_row_int16_avx512(a.x + m * a.ldx, a.K, a.group, q, s);
          } else {
            quantize_row_int8_avx512(a.x + m * a.ldx, a.K, a.group, q, s);
          }
          for (int64_t p = 0; p < steps; ++p) {
            uint32_t word = 0;
            for (int b = 0; b < kPer; ++b) word |= static_cast<uint32_t>(static_cast<U>(q[kPer * p + b])) << (kBits * b);
            dst[p * kMr + i] = word;
          }
          for (int64_t g = 0; g < groups; ++g) {
            sdst[g * kMr + i] = s[g];
            int32_t sum = 0;  // the offset weights' surplus: 128 x sum(x) per group (8-bit x)
            if constexpr (kBits == 8) {
              for (int64_t k = g * a.group; k < (g + 1) * a.group; ++k) sum += q[k];
            }
            cdst[g * kMr + i] = 128 * sum;
          }
        } else {
          for (int64_t p = 0; p < steps; ++p) dst[p * kMr + i] = 0u;
          for (int64_t g = 0; g < groups; ++g) {
            sdst[g * kMr + i] = 0.0f;
            cdst[g * kMr + i] = 0;
          }
        }
      }
    }
  }
}

// Where a micro-kernel reads a K block of one panel: a per-call packed panel (words, then
// scales: the layout above), or a persistent one (int8 pairs, 64 bytes a step, and its own
// scales: linear_int8_panels.h).
struct PanelBlock {
  const void* words;
  const float* scales;  // [kc / group][32]
};

// ct[8][32] += the K block [k0, k0 + kc) of x tile × panel, group by group.
template <int kBits, bool kPersistent>
TESSERA_TARGET_AVX512_VNNI void microkernel(const uint32_t* xt, const float* xst, const int32_t* xct,
                                            PanelBlock block, int64_t kc, int64_t group, float* ct) {
  constexpr int kPer = k_per_word(kBits);
  static_assert(!kPersistent || kBits == 16, "persistent panels hold int8 pairs for 16-bit x");
  const uint32_t* panel = static_cast<const uint32_t*>(block.words);
  const int8_t* pairs = static_cast<const int8_t*>(block.words);
  const float* wscales = block.scales;
  for (int64_t g = 0; g < kc / group; ++g) {
    __m512i acc[kMr][2];
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    const int64_t p0 = g * group / kPer, p1 = (g + 1) * group / kPer;
    // One step per iteration: unrolled by 2, GCC 12 copies the accumulators again (M = 128 on
    // panels 1.21x -> 0.92x bf16, bench/linear_int8_bench.cc).
#pragma GCC unroll 1
    for (int64_t p = p0; p < p1; ++p) {
      __m512i w0, w1;
      if constexpr (kPersistent) {
        w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs + p * 64)));
        w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs + p * 64 + 32)));
      } else {
        w0 = _mm512_loadu_si512(panel + p * kNr);
        w1 = _mm512_loadu_si512(panel + p * kNr + 16);
      }
      const uint32_t* xk = xt + p * kMr;
#pragma GCC unroll 8
      for (int i = 0; i < kMr; ++i) {
        const __m512i xv = _mm512_set1_epi32(static_cast<int32_t>(xk[i]));
        if constexpr (kBits == 16) {
          acc[i][0] = dpwssd(acc[i][0], xv, w0);
          acc[i][1] = dpwssd(acc[i][1], xv, w1);
        } else {
          acc[i][0] = dpbusd(acc[i][0], w0, xv);  // unsigned (offset) weights x signed x
          acc[i][1] = dpbusd(acc[i][1], w1, xv);
        }
      }
    }
    const __m512 s0 = _mm512_loadu_ps(wscales + g * kNr), s1 = _mm512_loadu_ps(wscales + g * kNr + 16);
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      if constexpr (kBits == 8) {
        const __m512i surplus = _mm512_set1_epi32(xct[g * kMr + i]);
        acc[i][0] = _mm512_sub_epi32(acc[i][0], surplus);
        acc[i][1] = _mm512_sub_epi32(acc[i][1], surplus);
      }
      const __m512 sx = _mm512_set1_ps(xst[g * kMr + i]);
      float* row = ct + i * kNr;
      _mm512_storeu_ps(row, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][0]), _mm512_mul_ps(s0, sx), _mm512_loadu_ps(row)));
      _mm512_storeu_ps(row + 16,
                       _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][1]), _mm512_mul_ps(s1, sx), _mm512_loadu_ps(row + 16)));
    }
  }
}

// Panels [p0, p1) on the calling thread. kPersistent: a.w and a.scales are persistent
// panels (linear_int8_panels.h), read in place; otherwise each chunk's K block is packed.
template <int kBits, bool kPersistent>
void gemm_panels(const Int8LinearArgs& a, const uint32_t* xp, const float* xs, const int32_t* xc, int64_t tiles,
                 int64_t p0, int64_t p1) {
  constexpr int kPer = k_per_word(kBits);
  const int64_t kb = block_k(a.group, kPersistent ? kPersistentBlockK : kPackedBlockK), groups = a.K / a.group;
  const int64_t panel_words = kb / kPer * kNr + kb / a.group * kNr;
  thread_local std::vector<uint32_t> chunk_buffer;
  uint32_t* chunk = kPersistent ? nullptr : scratch(chunk_buffer, kChunkPanels * panel_words);
  // A persistent panel is K / 2 steps of 64 bytes; its K block starts k0 * 32 bytes in.
  const int64_t panel_bytes = a.K * 32;
  alignas(64) float ct[kMr * kNr];
  NextBlockPrefetcher prefetch;
  for (int64_t c0 = p0; c0 < p1; c0 += kChunkPanels) {
    const int64_t c1 = std::min(p1, c0 + kChunkPanels);
    for (int64_t k0 = 0; k0 < a.K; k0 += kb) {
      const int64_t kc = std::min(kb, a.K - k0);
      const bool last_k = k0 + kc == a.K;
      // The int8 rows of the block after this one (the next K block of this chunk, or the
      // next chunk's first), fetched while this one's tiles run.
      const int64_t nc0 = last_k ? c1 : c0, nc1 = last_k ? std::min(p1, c1 + kChunkPanels) : c1;
      const int64_t nk0 = last_k ? 0 : k0 + kc;
      const int64_t nkc = std::min(kb, a.K - nk0);
      if constexpr (kPersistent) {
        prefetch.start(a.w, panel_bytes, nc0, nc1, nk0 * 32, nkc * 32, tiles * (c1 - c0));
      } else {
        prefetch.start(a.w, a.K, nc0 * kNr, std::min(a.N, nc1 * kNr), nk0, nkc, tiles * (c1 - c0));
        for (int64_t p = c0; p < c1; ++p) pack_panel<kBits>(a, p * kNr, k0, kc, chunk + (p - c0) * panel_words);
      }
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m0 = t * kMr, rows = std::min<int64_t>(kMr, a.M - m0);
        const uint32_t* xt = xp + (t * a.K + k0) / kPer * kMr;
        const float* xst = xs + (t * groups + k0 / a.group) * kMr;
        const int32_t* xct = xc + (t * groups + k0 / a.group) * kMr;
        for (int64_t p = c0; p < c1; ++p) {
          const int64_t n0 = p * kNr, cols = std::min<int64_t>(kNr, a.N - n0);
          float* y = a.y + m0 * a.ldy + n0;
          if (k0 == 0) {
            std::memset(ct, 0, sizeof(ct));
          } else {
            for (int64_t i = 0; i < rows; ++i) std::memcpy(ct + i * kNr, y + i * a.ldy, cols * sizeof(float));
          }
          prefetch.step();
          PanelBlock block;
          if constexpr (kPersistent) {
            block = {a.w + p * panel_bytes + k0 * 32, a.scales + (p * groups + k0 / a.group) * kNr};
          } else {
            const uint32_t* packed = chunk + (p - c0) * panel_words;
            block = {packed, reinterpret_cast<const float*>(packed + kc / kPer * kNr)};
          }
          microkernel<kBits, kPersistent>(xt, xst, xct, block, kc, a.group, ct);
          for (int64_t i = 0; i < rows; ++i) {
            float* out = y + i * a.ldy;
            if (last_k && (a.bias != nullptr || a.act != Activation::kNone)) {
              for (int64_t j = 0; j < cols; ++j) out[j] = finish_output(ct[i * kNr + j], a.bias, n0 + j, a.act);
            } else {
              std::memcpy(out, ct + i * kNr, cols * sizeof(float));
            }
          }
        }
      }
    }
  }
}

template <int kBits, bool kPersistent = false>
void gemm(const Int8LinearArgs& a) {
  TESSERA_CHECK(a.group % 32 == 0 && a.K % a.group == 0) << "K=" << a.K << " group=" << a.group;
  constexpr int kPer = k_per_word(kBits);
  const int64_t tiles = (a.M + kMr - 1) / kMr, groups = a.K / a.group;
  thread_local std::vector<uint32_t> x_buffer;
  thread_local std::vector<float> xs_buffer;
  thread_local std::vector<int32_t> xc_buffer;
  uint32_t* xp = scratch(x_buffer, tiles * a.K / kPer * kMr);
  float* xs = scratch(xs_buffer, tiles * groups * kMr);
  int32_t* xc = scratch(xc_buffer, tiles * groups * kMr);
  pack_x<kBits>(a, tiles, xp, xs, xc);
  const int64_t panels = (a.N + kNr - 1) / kNr;
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), panels));
  if (threads <= 1 || a.M * a.N * a.K < 256 * 1024) {
    gemm_panels<kBits, kPersistent>(a, xp, xs, xc, tiles, 0, panels);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t base = panels / nt, extra = panels % nt;
    const int64_t p0 = tid * base + std::min(tid, extra);
    gemm_panels<kBits, kPersistent>(a, xp, xs, xc, tiles, p0, p0 + base + (tid < extra ? 1 : 0));
  }
}

}  // namespace

void gemm_int8_x16_avx512_vnni(const Int8LinearArgs& a) { gemm<16>(a); }
void gemm_int8_x8_avx512_vnni(const Int8LinearArgs& a) { gemm<8>(a); }
void gemm_int8_panels_avx512_vnni(const Int8LinearArgs& a) { gemm<16, /*kPersistent=*/true>(a); }

}  // namespace tessera::cpu::detail
