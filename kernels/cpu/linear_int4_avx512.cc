// AVX-512 VNNI flavour of the low-bit linear kernels (kernels/int4_layout.h has the layout). One
// 64-byte step of a panel is 4 inputs of 32 columns: its low nibbles are the vpdpbusd lanes
// of columns 0-15 (4 unsigned bytes each), its high nibbles those of columns 16-31, and 4
// bytes of x broadcast to every lane are the signed operand. Per step and row of x: a load
// and two masks shared by the rows (the high nibbles multiply in place, 16 times their value,
// and the group's sums are divided by 16 once), and two vpdpbusd (128 products).
//
// Tiles of MT rows of x times PN panels (MT x PN = 4: 8 integer and 8 float accumulators):
// decode (1 row) streams 4 panels at once so that 8 independent dot-product chains hide the
// instruction's latency (one panel at a time with its steps split over 4 chains streamed
// 0.8x as fast, in cache and from DRAM: bench/linear_int4_bench.cc); 4 rows of x reuse each
// unpacked step 4 times.
//
// Without top bits the step needs one mask: the whole byte (low nibble plus 16 times the high
// one) goes into one product and the low nibbles into the other, and the group's high-nibble
// sums are the difference divided by 16, exactly (decode is bound by instructions per byte
// as much as by DRAM: each 512-bit operation takes a pipe for two cycles on Zen 4).
//
// A super-block scheme's f16 d (and dmin) are converted once per super-block, into a small
// array the groups' scale products read (the tile takes the registers): one thread in L2,
// q4_K 49.8-54.5 GB/s of panels against 43.7-48.6 before both changes (linear_int4_bench,
// interleaved, 2026-12-07); q4_0 59.4-60.8 against 56.3-59.3.
//
// Top bits (5- and 6-bit schemes): the step's 16 or 32 bytes of them, broadcast to every
// 16- or 32-byte lane of a 64-byte register, are shifted per lane (kernels/int4_layout.h puts
// each lane's bits at its own position) to bit 4 (and 5) and merged into the nibbles.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/linear_int4_kernels.h"
#include "kernels/cpu/vnni_asm.h"

#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define TESSERA_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

TESSERA_TARGET_AVX512_VNNI inline __m512 f16x16(const uint8_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}
TESSERA_TARGET_AVX512_VNNI inline __m512 u8x16(const uint8_t* at) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
}
TESSERA_TARGET_AVX512_VNNI inline __m512 i8x16(const uint8_t* at) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
}

// A super-block's d (and dmin) of a panel's 32 columns as f32, converted once for its groups.
struct SuperBlockScales {
  alignas(64) float d[32], dmin[32];
};

template <Int4Scheme S>
constexpr bool has_super_blocks() {
  return int4_super_block(S) || S == Int4Scheme::kSixBit;
}

// At the first group of each super-block, its record's d (and dmin) converted into `out`.
template <Int4Scheme S>
TESSERA_TARGET_AVX512_VNNI inline void convert_super_block(const uint8_t* rec, int64_t g, SuperBlockScales& out) {
  constexpr int64_t kGroups = int4_super_block(S) ? 8 : 16, kRecordBytes = int4_record_bytes(S);
  if (g % kGroups != 0) return;
  const uint8_t* r = rec + (g / kGroups) * kRecordBytes;
  for (int half = 0; half < 2; ++half) {
    _mm512_store_ps(out.d + 16 * half, f16x16(r + 32 * half));
    if constexpr (int4_super_block(S)) _mm512_store_ps(out.dmin + 16 * half, f16x16(r + 64 + 32 * half));
  }
}

// The s and m of a panel's 32 columns for weight group g, as two halves of 16: the values of
// detail::int4_group_scale (m only where it is not o s: int4_q_offset). `sb`: the group's
// super-block's d and dmin (super-block schemes).
template <Int4Scheme S>
TESSERA_TARGET_AVX512_VNNI inline void group_scales(const uint8_t* rec, int64_t g, [[maybe_unused]] const SuperBlockScales& sb,
                                                    __m512 s[2], __m512 m[2]) {
  for (int half = 0; half < 2; ++half) {
    if constexpr (S == Int4Scheme::kSymmetric || S == Int4Scheme::kSymmetric5) {
      s[half] = f16x16(rec + g * 64 + 32 * half);
    } else if constexpr (int4_asymmetric(S)) {
      s[half] = f16x16(rec + g * 128 + 32 * half);
      m[half] = f16x16(rec + g * 128 + 64 + 32 * half);
    } else if constexpr (S == Int4Scheme::kSixBit) {
      const uint8_t* r = rec + (g / 16) * kSixBitRecordBytes;
      s[half] = _mm512_mul_ps(_mm512_load_ps(sb.d + 16 * half), i8x16(r + 64 + (g % 16) * 32 + 16 * half));
    } else {
      const uint8_t* r = rec + (g / 8) * kInt4SuperRecordBytes;
      s[half] = _mm512_mul_ps(_mm512_load_ps(sb.d + 16 * half), u8x16(r + 128 + (g % 8) * 32 + 16 * half));
      m[half] = _mm512_mul_ps(_mm512_load_ps(sb.dmin + 16 * half), u8x16(r + 384 + (g % 8) * 32 + 16 * half));
    }
  }
}

// Where a step's top bits go: per 16-bit lane, the left shift that brings the low nibbles'
// bit(s) to bit 4 and the right shift for the high nibbles', and the mask of the result.
//  2 bits (32 bytes, broadcast to both 32-byte halves): left 4 and 2, right 0 and 2.
//  1 bit (16 bytes, broadcast to the four 16-byte lanes L): left 4 - L, right L.
struct TopBitShifts {
  __m512i lo_left, hi_right, mask;
};

template <int BITS>
TESSERA_TARGET_AVX512_VNNI inline TopBitShifts top_bit_shifts() {
  alignas(64) uint16_t lane[32];
  for (int i = 0; i < 32; ++i) lane[i] = static_cast<uint16_t>(BITS == 2 ? 2 * (i / 16) : i / 8);
  const __m512i right = _mm512_load_si512(lane);
  const __m512i left = _mm512_sub_epi16(_mm512_set1_epi16(4), right);
  return {left, right, _mm512_set1_epi8(BITS == 2 ? 0x30 : 0x10)};
}

// lo | (top bits of lo's columns), hi likewise (ternary logic 0xF8: A | (B & C)).
template <int BITS>
TESSERA_TARGET_AVX512_VNNI inline void merge_top_bits(const uint8_t* top, const TopBitShifts& sh, __m512i& lo,
                                                      __m512i& hi) {
  const __m512i bits =
      BITS == 2 ? _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(top)))
                : _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(top)));
  lo = _mm512_ternarylogic_epi32(lo, _mm512_sllv_epi16(bits, sh.lo_left), sh.mask, 0xF8);
  hi = _mm512_ternarylogic_epi32(hi, _mm512_srlv_epi16(bits, sh.hi_right), sh.mask, 0xF8);
}

// A step's two operands of vpdpbusd's unsigned bytes: with top bits, the low and the high
// columns' values; without, the low nibbles and the whole byte (lo + 16 hi: a group's sums
// stay exact, 32 x 255 x 127 < 2^31), which high_sums turns into the high columns' sums.
template <int BITS>
TESSERA_TARGET_AVX512_VNNI inline void split_nibbles(__m512i v, const uint8_t* top, [[maybe_unused]] const TopBitShifts& sh,
                                                     __m512i& lo, __m512i& hi) {
  lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
  if constexpr (BITS == 0) {
    hi = v;
  } else {
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
    merge_top_bits<BITS>(top, sh, lo, hi);
  }
}

// The high columns' group sums from the second operand's (split_nibbles): without top bits
// (whole bytes - low nibbles) / 16, exactly.
template <int BITS>
TESSERA_TARGET_AVX512_VNNI inline __m512i high_sums(__m512i lo_sums, __m512i second_sums) {
  if constexpr (BITS == 0) return _mm512_srai_epi32(_mm512_sub_epi32(second_sums, lo_sums), 4);
  return second_sums;
}

template <Int4Scheme S, int MT, int PN>
TESSERA_TARGET_AVX512_VNNI void tile(const Int4Args& a, int64_t m0, int64_t p0) {
  constexpr int kTop = int4_top_bits(S), kOffset = int4_q_offset(S);
  constexpr int64_t G = int4_weight_group(S), kStep = int4_step_bytes(S);
  const int64_t K = a.K, groups = K / G, x_groups = K / kInt4Group;
  const int32_t* xsum = G == kSixBitGroup ? a.xsum16 : a.xsum;
  const int64_t panel_stride = int4_panel_stride(S, K), record_stride = int4_record_stride(S, K);
  [[maybe_unused]] const TopBitShifts shifts = top_bit_shifts<kTop>();
  const uint8_t* panel[PN];
  for (int j = 0; j < PN; ++j) panel[j] = a.nibbles + (p0 + j) * panel_stride;
  const int8_t* x[MT];
  for (int i = 0; i < MT; ++i) x[i] = a.xq + (m0 + i) * K;
  __m512 total[MT][PN][2];
#pragma GCC unroll 4
  for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < PN; ++j) total[i][j][0] = total[i][j][1] = _mm512_setzero_ps();
  [[maybe_unused]] SuperBlockScales super[has_super_blocks<S>() ? PN : 1];
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (has_super_blocks<S>()) {
      for (int j = 0; j < PN; ++j) convert_super_block<S>(a.scales + (p0 + j) * record_stride, g, super[j]);
    }
    __m512i acc[MT][PN][2];
#pragma GCC unroll 4
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < PN; ++j) acc[i][j][0] = acc[i][j][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int64_t t = g * (G / 4); t < (g + 1) * (G / 4); ++t) {
#pragma GCC unroll 4
      for (int j = 0; j < PN; ++j) {
        const __m512i v = _mm512_loadu_si512(panel[j] + t * kStep);
        __m512i lo, hi;
        split_nibbles<kTop>(v, panel[j] + t * kStep + 64, shifts, lo, hi);
#pragma GCC unroll 4
        for (int i = 0; i < MT; ++i) {
          int32_t four;  // x[4t .. 4t + 4), to every lane
          std::memcpy(&four, x[i] + 4 * t, sizeof(four));
          const __m512i xb = _mm512_set1_epi32(four);
          acc[i][j][0] = dpbusd(acc[i][j][0], lo, xb);
          acc[i][j][1] = dpbusd(acc[i][j][1], hi, xb);
        }
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < PN; ++j) acc[i][j][1] = high_sums<kTop>(acc[i][j][0], acc[i][j][1]);
#pragma GCC unroll 4
    for (int j = 0; j < PN; ++j) {
      __m512 s[2], m[2];
      group_scales<S>(a.scales + (p0 + j) * record_stride, g, super[has_super_blocks<S>() ? j : 0], s, m);
#pragma GCC unroll 4
      for (int i = 0; i < MT; ++i) {
        const float xs = a.xs[(m0 + i) * x_groups + g * G / kInt4Group];
        const int32_t X = xsum[(m0 + i) * groups + g];
        const __m512 sx = _mm512_set1_ps(xs);
        for (int h = 0; h < 2; ++h) {
          if constexpr (kOffset != 0) {
            const __m512i P = _mm512_sub_epi32(acc[i][j][h], _mm512_set1_epi32(kOffset * X));
            total[i][j][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P), _mm512_mul_ps(s[h], sx), total[i][j][h]);
          } else {
            total[i][j][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j][h]), _mm512_mul_ps(s[h], sx), total[i][j][h]);
            total[i][j][h] = _mm512_fnmadd_ps(m[h], _mm512_set1_ps(xs * static_cast<float>(X)), total[i][j][h]);
          }
        }
      }
    }
  }
  for (int j = 0; j < PN; ++j) {
    const int64_t n0 = (p0 + j) * kInt4PanelColumns;
    const int64_t columns = std::min<int64_t>(kInt4PanelColumns, a.N - n0);
    for (int i = 0; i < MT; ++i) {
      alignas(64) float out[kInt4PanelColumns];
      _mm512_store_ps(out, total[i][j][0]);
      _mm512_store_ps(out + 16, total[i][j][1]);
      float* y = a.y + (m0 + i) * a.ldy;
      for (int64_t c = 0; c < columns; ++c) y[n0 + c] = finish_output(out[c], a.bias, n0 + c, a.act);
    }
  }
}

template <Int4Scheme S>
void run(const Int4Args& a, int64_t p0, int64_t p1) {
  int64_t m = 0;
  for (; m + 4 <= a.M; m += 4) {
    for (int64_t p = p0; p < p1; ++p) tile<S, 4, 1>(a, m, p);
  }
  for (; m + 2 <= a.M; m += 2) {
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) tile<S, 2, 2>(a, m, p);
    for (; p < p1; ++p) tile<S, 2, 1>(a, m, p);
  }
  for (; m < a.M; ++m) {
    int64_t p = p0;
    for (; p + 4 <= p1; p += 4) tile<S, 1, 4>(a, m, p);
    for (; p + 2 <= p1; p += 2) tile<S, 1, 2>(a, m, p);
    for (; p < p1; ++p) tile<S, 1, 1>(a, m, p);
  }
}

}  // namespace

void int4_panels_avx512_vnni(const Int4Args& a, int64_t p0, int64_t p1) {
  switch (a.scheme) {
    case Int4Scheme::kSymmetric:
      return run<Int4Scheme::kSymmetric>(a, p0, p1);
    case Int4Scheme::kSuperBlock:
      return run<Int4Scheme::kSuperBlock>(a, p0, p1);
    case Int4Scheme::kSixBit:
      return run<Int4Scheme::kSixBit>(a, p0, p1);
    case Int4Scheme::kSymmetric5:
      return run<Int4Scheme::kSymmetric5>(a, p0, p1);
    case Int4Scheme::kAsymmetric:
      return run<Int4Scheme::kAsymmetric>(a, p0, p1);
    case Int4Scheme::kAsymmetric5:
      return run<Int4Scheme::kAsymmetric5>(a, p0, p1);
    case Int4Scheme::kSuperBlock5:
      return run<Int4Scheme::kSuperBlock5>(a, p0, p1);
  }
}

}  // namespace tessera::cpu::detail
