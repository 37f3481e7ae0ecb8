// AVX2 flavour of the low-bit linear kernels: the AVX-512 scheme (linear_int4_avx512.cc) on
// 8-lane vectors, without VNNI. A 64-byte step is two 32-byte halves (lanes of columns 0-7
// and 8-15 in their low nibbles, 16-23 and 24-31 in their high ones); vpmaddubsw multiplies
// the unsigned nibbles by x's signed bytes into pairs of 16-bit sums (at most 2 x 15 x 127,
// never saturating) and vpmaddwd by ones adds the pairs into the 32-bit lanes, so the group
// sums are the exact integers the other flavours compute. One row of x and one panel per
// pass: 4 integer and 4 float accumulators of the 16 registers. The 6-bit scheme adds the
// step's 32 bytes of top bits: each 32-byte quarter of the values (columns 0-7, 8-15, 16-23,
// 24-31) takes its 2 bits from the same 32 bytes shifted by its own amount (0, 2, 4, 6) to
// bits 4-5 (vpmaddubsw's sums stay exact: 2 x 63 x 127 < 32768); the 5-bit ones add 16 bytes,
// broadcast to both 128-bit lanes, each lane of each quarter shifting its own bit to bit 4.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/linear_int4_kernels.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

TESSERA_TARGET_AVX2 inline __m256 f16x8(const uint8_t* at) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
}
TESSERA_TARGET_AVX2 inline __m256 u8x8(const uint8_t* at) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
}
TESSERA_TARGET_AVX2 inline __m256 i8x8(const uint8_t* at) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
}

// s and m of the panel's columns 8v .. 8v + 7 (v < 4) for weight group g: the values of
// detail::int4_group_scale (m only where it is not o s: int4_q_offset).
template <Int4Scheme S>
TESSERA_TARGET_AVX2 inline void group_scales(const uint8_t* rec, int64_t g, __m256 s[4], __m256 m[4]) {
  for (int v = 0; v < 4; ++v) {
    if constexpr (S == Int4Scheme::kSymmetric || S == Int4Scheme::kSymmetric5) {
      s[v] = f16x8(rec + g * 64 + 16 * v);
    } else if constexpr (int4_asymmetric(S)) {
      s[v] = f16x8(rec + g * 128 + 16 * v);
      m[v] = f16x8(rec + g * 128 + 64 + 16 * v);
    } else if constexpr (S == Int4Scheme::kSixBit) {
      const uint8_t* r = rec + (g / 16) * kSixBitRecordBytes;
      s[v] = _mm256_mul_ps(f16x8(r + 16 * v), i8x8(r + 64 + (g % 16) * 32 + 8 * v));
    } else {
      const uint8_t* r = rec + (g / 8) * kInt4SuperRecordBytes;
      s[v] = _mm256_mul_ps(f16x8(r + 16 * v), u8x8(r + 128 + (g % 8) * 32 + 8 * v));
      m[v] = _mm256_mul_ps(f16x8(r + 64 + 16 * v), u8x8(r + 384 + (g % 8) * 32 + 8 * v));
    }
  }
}

// The top 2 bits of a 6-bit quarter at bits 4-5 of each byte (the quarter's shift is
// SHIFT: 0, 2, 4 or 6), from a step's 32 bytes of top bits.
template <int SHIFT>
TESSERA_TARGET_AVX2 inline __m256i top_bits(__m256i bits) {
  const __m256i mask = _mm256_set1_epi8(0x30);
  if constexpr (SHIFT < 4) return _mm256_and_si256(_mm256_slli_epi16(bits, 4 - SHIFT), mask);
  if constexpr (SHIFT == 4) return _mm256_and_si256(bits, mask);
  return _mm256_and_si256(_mm256_srli_epi16(bits, SHIFT - 4), mask);
}

// The top bit of 5-bit quarter V at bit 4 of each byte: bit 2V of the 16 bytes (broadcast to
// both 128-bit lanes) in the low lane, bit 2V + 1 in the high one.
template <int V>
TESSERA_TARGET_AVX2 inline __m256i top_bit(__m256i bits) {
  const __m256i mask = _mm256_set1_epi8(0x10);
  constexpr int b0 = 2 * V, b1 = 2 * V + 1;
  if constexpr (V < 2) {
    return _mm256_and_si256(_mm256_sllv_epi32(bits, _mm256_setr_epi32(4 - b0, 4 - b0, 4 - b0, 4 - b0, 4 - b1, 4 - b1,
                                                                       4 - b1, 4 - b1)),
                            mask);
  }
  return _mm256_and_si256(
      _mm256_srlv_epi32(bits, _mm256_setr_epi32(b0 - 4, b0 - 4, b0 - 4, b0 - 4, b1 - 4, b1 - 4, b1 - 4, b1 - 4)), mask);
}

template <Int4Scheme S>
TESSERA_TARGET_AVX2 void panel_row(const Int4Args& a, int64_t m, int64_t p) {
  constexpr int kTop = int4_top_bits(S), kOffset = int4_q_offset(S);
  const int64_t K = a.K, G = int4_weight_group(S), groups = K / G, step = int4_step_bytes(S);
  const int32_t* xsum = G == kSixBitGroup ? a.xsum16 : a.xsum;
  const uint8_t* panel = a.nibbles + p * int4_panel_stride(S, K);
  const uint8_t* rec = a.scales + p * int4_record_stride(S, K);
  const int8_t* x = a.xq + m * K;
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  // Vector v holds columns 8v .. 8v + 7: 0 and 1 from the halves' low nibbles, 2 and 3 from
  // their high ones.
  __m256 total[4];
  for (int v = 0; v < 4; ++v) total[v] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = _mm256_setzero_si256();
    for (int64_t t = g * (G / 4); t < (g + 1) * (G / 4); ++t) {
      int32_t four;
      std::memcpy(&four, x + 4 * t, sizeof(four));
      const __m256i xb = _mm256_set1_epi32(four);
      const uint8_t* at = panel + t * step;
      __m256i q[4];
      for (int half = 0; half < 2; ++half) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * half));
        q[half] = _mm256_and_si256(w, low);
        q[2 + half] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
      }
      if constexpr (kTop == 2) {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 64));
        q[0] = _mm256_or_si256(q[0], top_bits<0>(bits));
        q[1] = _mm256_or_si256(q[1], top_bits<2>(bits));
        q[2] = _mm256_or_si256(q[2], top_bits<4>(bits));
        q[3] = _mm256_or_si256(q[3], top_bits<6>(bits));
      } else if constexpr (kTop == 1) {
        const __m256i bits = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 64)));
        q[0] = _mm256_or_si256(q[0], top_bit<0>(bits));
        q[1] = _mm256_or_si256(q[1], top_bit<1>(bits));
        q[2] = _mm256_or_si256(q[2], top_bit<2>(bits));
        q[3] = _mm256_or_si256(q[3], top_bit<3>(bits));
      }
      for (int v = 0; v < 4; ++v) {
        acc[v] = _mm256_add_epi32(acc[v], _mm256_madd_epi16(_mm256_maddubs_epi16(q[v], xb), ones));
      }
    }
    __m256 s[4], mo[4];
    group_scales<S>(rec, g, s, mo);
    const float xs = a.xs[m * (K / kInt4Group) + g * G / kInt4Group];
    const int32_t X = xsum[m * groups + g];
    const __m256 sx = _mm256_set1_ps(xs);
    for (int v = 0; v < 4; ++v) {
      if constexpr (kOffset != 0) {
        const __m256i P = _mm256_sub_epi32(acc[v], _mm256_set1_epi32(kOffset * X));
        total[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P), _mm256_mul_ps(s[v], sx), total[v]);
      } else {
        total[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[v]), _mm256_mul_ps(s[v], sx), total[v]);
        total[v] = _mm256_fnmadd_ps(mo[v], _mm256_set1_ps(xs * static_cast<float>(X)), total[v]);
      }
    }
  }
  alignas(32) float out[kInt4PanelColumns];
  for (int v = 0; v < 4; ++v) _mm256_store_ps(out + 8 * v, total[v]);
  const int64_t n0 = p * kInt4PanelColumns;
  const int64_t columns = std::min<int64_t>(kInt4PanelColumns, a.N - n0);
  float* y = a.y + m * a.ldy;
  for (int64_t c = 0; c < columns; ++c) y[n0 + c] = finish_output(out[c], a.bias, n0 + c, a.act);
}

template <Int4Scheme S>
void run(const Int4Args& a, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t m = 0; m < a.M; ++m) panel_row<S>(a, m, p);
  }
}

}  // namespace

void int4_panels_avx2(const Int4Args& a, int64_t p0, int64_t p1) {
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
