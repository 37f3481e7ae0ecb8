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
// AVX-512 VNNI (vpdpbusd); only where cpu_has_avx512_vnni().
void gemv_int8_dot_avx512_vnni(const Int8DotArgs& d, int64_t n0, int64_t n1);
bool cpu_has_avx512_vnni();
// quantize_int8's rule (linear_int8.h) for one f32 row, bit for bit.
void quantize_row_int8_avx512(const float* x, int64_t K, int64_t group, int8_t* q, float* scales);

// The weight-only GEMV with x in 16-bit fixed point per group (xq [M, K], xs [M, K / group]
// = max|x| / 32767) and int16 dot products (AVX-512 VNNI vpdpwssd): what the int8 linear layer
// runs where int8_gemv_uses_int16_x() / int8_gemm_uses_int16_x() say so (linear_int8_avx512.cc explains why).
struct Int16XArgs {
  const Int8LinearArgs* a;
  const int16_t* xq;
  const float* xs;
};
void gemv_int8_x16_avx512_vnni(const Int16XArgs& d, int64_t n0, int64_t n1);
// a's rows of x in 16-bit fixed point per group with `isa`'s quantizer (kAvx512 or kAvx2),
// into this thread's buffers (reused: valid until its next call).
Int16XArgs quantize_x_int16(CpuIsa isa, const Int8LinearArgs& a);
void quantize_row_int16_avx512(const float* x, int64_t K, int64_t group, int16_t* q, float* scales);
// The same GEMV on AVX2 (vpmaddwd), and its x quantizer (same values as the AVX-512 one).
void gemv_int8_x16_avx2(const Int16XArgs& d, int64_t n0, int64_t n1);
void quantize_row_int16_avx2(const float* x, int64_t K, int64_t group, int16_t* q, float* scales);
// The GEMM (rows above the GEMV's) with the same arithmetic: gemm_int8_vnni.cc; and its
// 8-bit-x form for int8 activations (x quantized per group by the weights' rule, vpdpbusd).
void gemm_int8_x16_avx512_vnni(const Int8LinearArgs& a);
void gemm_int8_x8_avx512_vnni(const Int8LinearArgs& a);
// Persistent panels (linear_int8_panels.h): a.w is the panels' int8 pairs and a.scales their
// scales, in that layout. The GEMM of gemm_int8_vnni.cc reading them in place, and the GEMV
// for panels [p0, p1) (x as Int16XArgs; linear_int8_panels.cc).
void gemm_int8_panels_avx512_vnni(const Int8LinearArgs& a);
void gemv_int8_panels_avx512_vnni(const Int16XArgs& d, int64_t p0, int64_t p1);

// Weight rows [n0, n1) dequantized to f32 into out ((n1 - n0) * K floats).
void dequantize_int8_scalar(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out);
void dequantize_int8_avx2(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out);
void dequantize_int8_avx512(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out);

}  // namespace tessera::cpu::detail
