#pragma once
// Decoding of ggml's tensor storage types (as GGUF files hold them) to float32: the scalar
// reference the GGUF loader uses to turn quantized weights into floats, and the one SIMD
// and CUDA kernels for these formats are tested against. Written for clarity, one block at
// a time; the layouts are in ggml_dequant_blocks.h.
#include <cstdint>

#include "common/status.h"

namespace tessera {

// Whether dequantize_ggml decodes this GgmlType id (common/gguf/gguf_file.h): f32, f16,
// bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K and q6_K.
bool ggml_type_dequantizable(uint32_t type);

// Decodes `n` consecutive elements stored as `type` from `src` (any alignment) into `dst`.
// `n` must be a whole number of the type's blocks (32 elements for q4_0 ... q8_0, 256 for
// the K-quants, 1 for the float types), else InvalidArgument; a type not listed above is
// Unimplemented, naming it ("q2_K"). `src` holds n / block_elems * block_bytes bytes.
Status dequantize_ggml(uint32_t type, const uint8_t* src, int64_t n, float* dst);

}  // namespace tessera
