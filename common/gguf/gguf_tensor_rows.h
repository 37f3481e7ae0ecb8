#pragma once
// Reading a GGUF tensor the Checkpoint presents in its Hugging Face form: ggml blocks decoded
// to floats, rows taken in the order TensorInfo::row_order gives, TensorInfo::value_offset
// added. Only the rows asked for are decoded, so a tensor-parallel rank reads its share.
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/weight_file.h"

namespace tessera {

// Whether `info` is a GGUF tensor stored in quantized ggml blocks (q8_0, q4_K, ...), not as
// plain f32, f16 or bf16 elements.
bool stored_in_ggml_blocks(const TensorInfo& info);

// Whether `info` must be decoded row by row (ggml blocks, a row order or a value offset)
// rather than read as plain elements.
bool needs_ggml_row_decoding(const TensorInfo& info);

// [begin, begin + count) along `axis` of `info`'s logical shape (axis -1: the whole tensor),
// decoded into a new tensor of `dtype` (f32, f16 or bf16). The caller has checked the range.
StatusOr<Tensor> decode_ggml_rows(const TensorInfo& info, DType dtype, int axis, int64_t begin, int64_t count);

}  // namespace tessera
