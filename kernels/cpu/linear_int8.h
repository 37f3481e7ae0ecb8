#pragma once
// The CPU int8 weight-only linear layer: y = x · dequant(W)^T (+ bias) (then an activation),
// where W is int8 [N, K] with one float32 scale per group of `group` consecutive input
// elements of each output row (dequant(W)[n, k] = W[n, k] * scales[n, k / group]).
// Activations stay float32 between layers; inside the layer x may be carried as integers.
// These kernels read row-major int8; where a backend's options prefer panels
// (int8_panels_preferred: AVX-512 VNNI, 16-bit x) the loader stores column panels instead and
// linear_int8_panels.h runs the same arithmetic.
//
// Two regimes, chosen by M (rows of x), like linear_cpu.h:
//  - M <= linear_int8_gemv_max_rows() (decode): memory-bandwidth bound, one byte per weight.
//    Each weight row is streamed once per tile of rows of x; a group's products are summed
//    apart and scaled once per group. With AVX2 or AVX-512, x in 16-bit fixed point per
//    group and integer products (vpmaddwd, vpdpwssd with VNNI); otherwise (scalar build,
//    int8_x16 off) int8 widened to f32 in registers and x exact.
//  - larger M (prefill, batched decode): compute bound. On AVX-512 VNNI CPUs the GEMM of
//    gemm_int8_vnni.cc (x in 16-bit fixed point, as the GEMV); elsewhere the packed GEMM
//    (gemm_packed.h) dequantizes each panel's K block to f32 as it packs it and runs its
//    f32 micro-kernel; where that has no kernel (scalar build) or the gemm policy is openblas,
//    panels of rows are dequantized and go to OpenBLAS sgemm.
//  - Opt-in, not weight-only (int8_activations, CpuKernelOptions::int8_dot): x quantized to 8
//    bits per group like the weights (llama.cpp's q8_0 x q8_0) at every M, so prompt and
//    decode share one arithmetic: GEMV-shaped integer dot products, and above the GEMV's rows
//    on AVX-512 VNNI the same GEMM with 8-bit x (vpdpbusd: twice the products per
//    instruction).
// Measured in bench/linear_int8_bench.cc; docs/quantization.md has the figures. Every choice
// (flavour, int8_x16, int8_dot, gemm) comes in through Int8LinearOptions, made by the CPU
// backend from its CpuKernelOptions (common/kernel_options.h).
#include <cstdint>

#include "common/dtype.h"
#include "kernels/activation.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu {

// Symmetric per-group quantization of W [N, K] (f32, f16 or bf16, rows K apart): for each
// group, scale = max|w| / 127 and q = round-to-nearest-even(w / scale) in [-127, 127]; an
// all-zero group has scale 0. q: [N, K]; scales: [N, K / group]. K % group must be 0.
void quantize_int8(const void* w, DType w_dtype, int64_t N, int64_t K, int64_t group, int8_t* q, float* scales);

// y[M, N] = x[M, K] · dequant(W)^T (+ bias[N]) (then `act`). Strides and aliasing rules as
// linear() in linear_cpu.h; K % group == 0 and group % 32 == 0. With the default
// CpuKernelOptions (the CPU backend passes its own).
void linear_int8(const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* w, const float* scales,
                 int64_t group, int64_t N, const float* bias, float* y, int64_t ldy, Activation act);

namespace detail {
struct Int8LinearOptions;
}
// Up to this many rows of x the GEMV kernel is used; above it, a GEMM (see above). 16; 7
// with int8 activations on AVX-512 VNNI, where the 8-bit-x GEMM runs
// (bench/linear_int8_bench.cc; docs/quantization.md).
int64_t linear_int8_gemv_max_rows(const detail::Int8LinearOptions& options);

namespace detail {
struct Int8LinearOptions {
  // From the backend's CpuKernelOptions (int8_linear_options below); the defaults are its defaults.
  CpuIsa isa = detected_cpu_isa();  // clamped to detected_cpu_isa()
  // false = the weight-only kernels (the default); true = x quantized per group too and
  // integer dot products (int8_dot; see above), for every M: the dot kernel's tiles of up
  // to 8 rows of x serve prefill as well, so prompt and decode see the same numerics.
  bool int8_activations = false;
  bool int16_x = true;  // int8_x16: see int8_gemv_uses_int16_x
  GemmKernel gemm_policy = GemmKernel::kAuto;  // the f32-x GEMM regime: packed_gemm_preferred
  LinearPath path = LinearPath::kAuto;  // forcing knob for tests and benchmarks
};
Int8LinearOptions int8_linear_options(const CpuKernelOptions& options);
// Whether int8 weights multiply x carried in 16-bit fixed point per group with integer dot
// products (linear_int8_kernels.h): x is then off by at most 2^-16 of its group's largest
// |x|. The GEMV does on AVX2 and AVX-512 (vpmaddwd; vpdpwssd with VNNI), the GEMM on
// AVX-512 VNNI CPUs, unless options.int16_x is off (f32 x, the kernels that widen int8 to
// f32; A/B benchmarking).
bool int8_gemv_uses_int16_x(const Int8LinearOptions& options);
bool int8_gemm_uses_int16_x(const Int8LinearOptions& options);
void linear_int8_with(const Int8LinearOptions& options, const float* x, int64_t M, int64_t K, int64_t ldx,
                      const int8_t* w, const float* scales, int64_t group, int64_t N, const float* bias, float* y,
                      int64_t ldy, Activation act);
}  // namespace detail

}  // namespace tessera::cpu
