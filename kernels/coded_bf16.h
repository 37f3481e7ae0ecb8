#pragma once
// Making coded bf16 weights (kernels/coded_bf16_layout.h) from a bf16 matrix, and the
// portable decoder every kernel and test checks against.
#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "common/tensor_arena.h"
#include "kernels/coded_bf16_layout.h"

namespace tessera {

// Whether a weight of this dtype and shape can be coded: a bf16 matrix whose input width is a
// multiple of the coded block. What the loader codes, reads in place for it and estimates.
inline bool bf16_matrix_codable(DType dtype, const std::vector<int64_t>& dims) {
  return dtype == DType::kBF16 && dims.size() == 2 && coded_bf16_codable(dims[1]);
}

struct CodedBf16Matrix {
  Tensor body;  // u8 [N, coded_bf16_row_bytes(K)]
  Tensor side;  // i32 [CodedBf16Side::elements(N, escapes)]
};

// Codes the bf16 matrix w [N, K] (rows K apart; K must be coded_bf16_codable), rows in
// parallel (OpenMP). Each row's table is the window of 7 consecutive high bytes that holds
// most of its weights (both signs counted together); everything else is an escape. The
// body comes from `arena` (null: a tensor of its own).
CodedBf16Matrix encode_coded_bf16(const uint16_t* w, int64_t N, int64_t K, TensorArena* arena = nullptr);
// The same with the portable encoder (simd false) or AVX-512 BW's where the CPU has it (true;
// what encode_coded_bf16 uses): for tests that hold the two to the same bytes.
CodedBf16Matrix encode_coded_bf16_with(const uint16_t* w, int64_t N, int64_t K, TensorArena* arena, bool simd);

// Rows [n0, n1), inputs [k0, k1) (multiples of 64) of a coded matrix (body rows
// coded_bf16_row_bytes(K) apart, side as laid out for N rows) back to bf16 into out (rows
// k1 - k0 apart), escapes included: exactly the matrix that was coded.
void decode_coded_bf16_rows(const uint8_t* body, const int32_t* side, int64_t N, int64_t side_elements, int64_t K,
                            int64_t n0, int64_t n1, int64_t k0, int64_t k1, uint16_t* out);
// The escapes of those rows and inputs written into out (laid out as above): for a decoder
// that leaves them +0.
void patch_coded_bf16_escapes(const int32_t* side, int64_t N, int64_t side_elements, int64_t n0, int64_t n1,
                              int64_t k0, int64_t k1, uint16_t* out);

}  // namespace tessera
