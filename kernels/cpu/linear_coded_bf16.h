#pragma once
// The CPU linear layer over coded bf16 weights (kernels/coded_bf16_layout.h): y = act(x · W^T
// + bias) with W's 12-bit-per-weight form, in the regimes the bf16 linear layer has
// (linear_cpu.h):
//  - up to kBf16DotGemvMaxRows rows of x on AVX-512 BF16 CPUs with bf16 dot products on: a
//    GEMV that reads each block once, turns its codes into high bytes with one in-register
//    table lookup (vpshufb) and multiplies as gemv_bf16_dot does (x rounded to bf16, products
//    exact, f32 sums); the escapes are added per row;
//  - where the bf16 layer would run the packed GEMM (prefill, larger batches): that GEMM,
//    decoding each panel's K block as it packs it (gemm_packed.h, WeightSource kU8);
//  - otherwise (the scalar build, small M without bf16 dot products): chunks of rows decoded
//    back to the exact bf16 matrix, then the bf16 linear layer on them.
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu {

// x [M, K] (rows ldx apart), W coded from an [N, K] bf16 matrix (body rows
// coded_bf16_row_bytes(K) apart; side of side_elements i32), y [M, N] (rows ldy apart).
void linear_coded_bf16(const detail::LinearOptions& options, const float* x, int64_t M, int64_t K, int64_t ldx,
                       const uint8_t* body, const int32_t* side, int64_t side_elements, int64_t N, const float* bias,
                       float* y, int64_t ldy, Activation act);

namespace detail {
// Whether linear_coded_bf16 takes the coded GEMV for M rows under `options` (else it
// decodes chunks): for tests that pin both paths.
bool coded_bf16_gemv_runs(const LinearOptions& options, int64_t M);
}  // namespace detail

}  // namespace tessera::cpu
