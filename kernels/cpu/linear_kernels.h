#pragma once
// Internal to the CPU linear layer (linear_cpu.cc, linear_gemm.cc): the per-ISA kernels.
// Each ISA lives in its own linear_gemv_<isa>.cc whose functions carry
// __attribute__((target(...))), so the library is built for baseline x86-64 and the wide
// instructions only run after the dispatcher has checked the CPU supports them.
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu::detail {

// One linear call, as the kernels see it (see linear() in linear_cpu.h for the meaning).
struct LinearArgs {
  const float* x;
  int64_t M, K, ldx;
  const void* w;
  DType w_dtype;
  int64_t N;
  const float* bias;
  float* y;
  int64_t ldy;
  Activation act;
};

// The GEMV kernel: y rows [m0, m1) x columns [n0, n1), reading each weight row of
// [n0, n1) once per group of up to kGemvRowTile rows of x (so once for decode batches).
// Applies bias and the activation.
inline constexpr int64_t kGemvRowTile = 8;
void gemv_scalar(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemv_avx2(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void gemv_avx512(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

// bf16 weights times x rounded to bf16 (vdpbf16ps), every row of x, weights read in place:
// the batched-decode kernel of the bf16 dot arithmetic (linear_gemv_bf16_dot.cc). AVX-512
// BF16 CPUs only (cpu_has_bf16_dot()); K any. Applies bias and the activation.
void gemv_bf16_dot(const LinearArgs& a);
// From 1 row (gemv_rows_before_packed_gemm) up to this many it runs instead of the f32
// GEMV below and the packed GEMM's bf16 dot kernel above, which
// repacks W every call: ~100M bf16 decode, tessera-bench, 2 threads, two interleaved runs:
// batch 8 1.14-1.15x, batch 12 1.09-1.46x, batch 16 0.99-1.02x the packed GEMM's tok/s.
inline constexpr int64_t kBf16DotGemvMaxRows = 16;

// Widens `n` contiguous f16 or bf16 values (src_dtype) to f32.
void widen_scalar(const uint16_t* src, DType src_dtype, float* dst, int64_t n);
void widen_avx2(const uint16_t* src, DType src_dtype, float* dst, int64_t n);
void widen_avx512(const uint16_t* src, DType src_dtype, float* dst, int64_t n);

// The sgemm regime (linear_gemm.cc), bias and activation included.
void gemm_linear(const LinearOptions& options, const LinearArgs& a);

// The bias + activation epilogue for one output value.
inline float finish_output(float acc, const float* bias, int64_t n, Activation act) {
  if (bias != nullptr) acc += bias[n];
  return activate(acc, act);
}
// Per-thread scratch that keeps its capacity between calls (fresh large allocations would
// page-fault on every call): buffer grown to at least n elements, its data.
template <typename T>
T* scratch(std::vector<T>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

}  // namespace tessera::cpu::detail
