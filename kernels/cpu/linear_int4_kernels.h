#pragma once
// Internal to the 4-bit linear layer (linear_int4.cc): the per-ISA kernels over panels, each
// in its own linear_int4_<isa>.cc compiled for its target, as linear_int8_kernels.h does.
#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/linear_int4.h"
#include "kernels/cpu/linear_kernels.h"  // finish_output

namespace tessera::cpu::detail {

// Column c's q at input k of a panel (kernels/int4_layout.h): its nibble and top bits.
inline int int4_q_at(Int4Scheme scheme, const uint8_t* panel, int64_t c, int64_t k) {
  const uint8_t* step = panel + (k / 4) * int4_step_bytes(scheme);
  int q = (step[4 * (c % 16) + k % 4] >> (c < 16 ? 0 : 4)) & 0x0f;
  if (int4_top_bits(scheme) == 2) q |= ((step[64 + 4 * (c % 8) + k % 4] >> (2 * (c / 8))) & 0x03) << 4;
  if (int4_top_bits(scheme) == 1) q |= ((step[64 + 4 * (c % 4) + k % 4] >> (c / 4)) & 0x01) << 4;
  return q;
}

// Column c's s and m for weight group g from a panel's scale records `rec`, in f32 exactly as
// ggml's decoders compute them (the SIMD kernels load the same values 16 or 8 at a time).
inline void int4_group_scale(Int4Scheme scheme, const uint8_t* rec, int64_t g, int64_t c, float* s, float* m) {
  const auto f16 = [](const uint8_t* at, int64_t i) { return f16_to_f32(reinterpret_cast<const uint16_t*>(at)[i]); };
  switch (scheme) {
    case Int4Scheme::kSymmetric:
    case Int4Scheme::kSymmetric5:
      *s = f16(rec, g * kInt4PanelColumns + c);
      *m = (scheme == Int4Scheme::kSymmetric ? 8.0f : 16.0f) * *s;
      return;
    case Int4Scheme::kAsymmetric:
    case Int4Scheme::kAsymmetric5:
      *s = f16(rec + g * 128, c);
      *m = f16(rec + g * 128 + 64, c);
      return;
    case Int4Scheme::kSuperBlock:
    case Int4Scheme::kSuperBlock5: {
      const uint8_t* r = rec + (g / 8) * kInt4SuperRecordBytes;
      *s = f16(r, c) * static_cast<float>(r[128 + (g % 8) * 32 + c]);
      *m = f16(r + 64, c) * static_cast<float>(r[384 + (g % 8) * 32 + c]);
      return;
    }
    case Int4Scheme::kSixBit: {
      const uint8_t* r = rec + (g / 16) * kSixBitRecordBytes;
      *s = f16(r, c) * static_cast<float>(static_cast<int8_t>(r[64 + (g % 16) * 32 + c]));
      *m = 32.0f * *s;
      return;
    }
  }
}

// One call as the kernels see it: x already quantized per group of 32 (xq [M, K] int8 in
// [-127, 127], xs [M, K / 32] its scales, xsum [M, K / 32] the sums of each group's xq,
// xsum16 [M, K / 16] those of each half group, for kSixBit's groups of 16).
struct Int4Args {
  Int4Scheme scheme;
  const uint8_t* nibbles;
  const uint8_t* scales;
  int64_t N, K, M;
  const int8_t* xq;
  const float* xs;
  const int32_t* xsum;
  const int32_t* xsum16;
  const float* bias;
  float* y;
  int64_t ldy;
  Activation act;
};

// y columns of panels [p0, p1) for every row of x, bias and activation applied. The three
// give the same bits: integer sums per weight group, then per group and column
// total = fma(P - o X, s * xs, total) where m = o s (int4_q_offset: the offset subtracted in
// integers, exactly, as ggml's own dot products do), else
// total = fma(P, s * xs, total); total = fma(-m, xs * X, total).
void int4_panels_scalar(const Int4Args& a, int64_t p0, int64_t p1);
void int4_panels_avx2(const Int4Args& a, int64_t p0, int64_t p1);
void int4_panels_avx512_vnni(const Int4Args& a, int64_t p0, int64_t p1);

}  // namespace tessera::cpu::detail
