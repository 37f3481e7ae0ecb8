#pragma once
// Int8 weights laid out once, at load time, the way the AVX-512 VNNI kernels read them:
// column panels. The row-major int8 [N, K] of linear_int8.h makes the VNNI GEMM repack every
// K block on every call (widen, transpose: as much time as the products at 8 rows of x, a
// third at 32), and its GEMV pays a conversion and a scale per group for every output and
// row. In panels both read 64-byte steps in place, with one vector of 32 columns per group
// end.
//
// Layout, for P = ceil(N / 32) panels of 32 output columns:
//  - weights int8 [P][K / 2][32][2]: step s of panel p holds, for each of its columns c,
//    w[32p + c][2s] then w[32p + c][2s + 1] (a pair of k, as vpdpwssd multiplies them once
//    widened to int16); a panel is K * 32 contiguous bytes;
//  - scales f32 [P][K / group][32]: the group scales of the panel's columns.
// Columns past N are weights 0 and scales 0. The values are quantize_int8's, only moved:
// the arithmetic is the 16-bit-x form of linear_int8.h (x in 16-bit fixed point per group,
// exact integer products per group, one conversion and scale per group).
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu {

inline constexpr int64_t kInt8PanelColumns = 32;
inline int64_t int8_panel_count(int64_t N) { return (N + kInt8PanelColumns - 1) / kInt8PanelColumns; }

// q [N, K] and scales [N, K / group] as quantize_int8 writes them, into the layout above:
// wp holds int8_panel_count(N) * K * 32 bytes, sp int8_panel_count(N) * (K / group) * 32 floats.
void pack_int8_panels(const int8_t* q, const float* scales, int64_t N, int64_t K, int64_t group, int8_t* wp,
                      float* sp);

// Whether int8 linears should be stored as panels for a backend with these options: the CPU
// has AVX-512 VNNI, `options.isa` does not lower the flavour below AVX-512, x is carried in
// 16 bits (int8_x16) and int8 activations are not requested (int8_dot). Where this is false
// the row-major kernels of linear_int8.h run.
bool int8_panels_preferred(const CpuKernelOptions& options);

// y[M, N] = x[M, K] · dequant(W)^T (+ bias) (then `act`), W in panels (K % group == 0,
// group % 32 == 0). Only where the CPU has AVX-512 VNNI.
void linear_int8_panels(const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* wp, const float* sp,
                        int64_t group, int64_t N, const float* bias, float* y, int64_t ldy, Activation act);

namespace detail {
// Up to this many rows of x the panel GEMV runs; above it the GEMM (bench/linear_int8_bench.cc).
int64_t int8_panel_gemv_max_rows();
// linear_int8_panels with the regime forced (kGemv / kGemm) or chosen by M (kAuto).
void linear_int8_panels_with(LinearPath path, const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* wp,
                             const float* sp, int64_t group, int64_t N, const float* bias, float* y, int64_t ldy,
                             Activation act);
}  // namespace detail

}  // namespace tessera::cpu
