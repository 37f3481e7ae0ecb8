#pragma once
// Internal to the 4-bit linear layer (linear_int4.cc): the per-ISA kernels over panels, each
// in its own linear_int4_<isa>.cc compiled for its target, as linear_int8_kernels.h does.
#include <cstdint>

#include "kernels/cpu/linear_int4.h"
#include "kernels/cpu/linear_kernels.h"  // finish_output

namespace tessera::cpu::detail {

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
// total = fma(P, s * xs, total); total = fma(-m, xs * X, total).
void int4_panels_scalar(const Int4Args& a, int64_t p0, int64_t p1);
void int4_panels_avx2(const Int4Args& a, int64_t p0, int64_t p1);
void int4_panels_avx512_vnni(const Int4Args& a, int64_t p0, int64_t p1);

}  // namespace tessera::cpu::detail
