#pragma once
// Internal to the CPU int8 linear layer (linear_int8.cc): the per-ISA kernels, each in its
// own linear_int8_<isa>.cc with __attribute__((target(...))), as linear_kernels.h does.
#include <cstdint>

#include "kernels/cpu/linear_kernels.h"  // finish_output

namespace tessera::cpu::detail {

// One int8 linear call as the kernels see it (see linear_int8() for the meaning).
struct Int8LinearArgs {
  const float* x;
  int64_t M, K, ldx;
  const int8_t* w;
  const float* scales;  // [N, K / group]
  int64_t group;
  int64_t N;
  const float* bias;
  float* y;
  int64_t ldy;
  Activation act;
};

// y rows [m0, m1) x columns [n0, n1), bias and activation applied.
void gemv_int8_scalar(const Int8LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemv_int8_avx2(const Int8LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemv_int8_avx512(const Int8LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

// The decode kernels with int8 activations: x quantized like the weights (per group of
// `group` inputs, symmetric, scale = max|x| / 127) into xq [M, K] / xs [M, K / group], then
// integer dot products per group (exact), scaled by weight scale x activation scale.
struct Int8DotArgs {
  const Int8LinearArgs* a;
  const int8_t* xq;
  const float* xs;
};
void gemv_int8_dot_scalar(const Int8DotArgs& d, int64_t n0, int64_t n1);
void gemv_int8_dot_avx2(const Int8DotArgs& d, int64_t n0, int64_t n1);

// Weight rows [n0, n1) dequantized to f32 into out ((n1 - n0) * K floats).
void dequantize_int8_scalar(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out);
void dequantize_int8_avx2(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out);
void dequantize_int8_avx512(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out);

}  // namespace tessera::cpu::detail
