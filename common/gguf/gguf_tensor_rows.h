#pragma once
// Reading a GGUF tensor the Checkpoint presents in its Hugging Face form: ggml blocks decoded
// to floats, rows taken in the order TensorInfo::row_order gives, TensorInfo::value_offset
// added. Only the rows asked for are decoded, so a tensor-parallel rank reads its share.
#include <cstdint>

#include "common/dtype.h"
#include "common/recycled_buffers.h"
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

// The same slice of a 2-D tensor stored in ggml blocks, kept as blocks: u8 [rows, bytes of
// the row slice], rows in row_order's logical order (a row's blocks are never reordered).
// A column slice (axis 1) must start and end on block boundaries; otherwise the error gives
// the numbers (a tensor-parallel split inside a block). value_offset must be 0. The copy is
// taken from `scratch` where given (load-time rows dropped once packed), else fresh.
StatusOr<Tensor> ggml_block_rows(const TensorInfo& info, int axis, int64_t begin, int64_t count,
                                 RecycledBuffers* scratch = nullptr);
// Rows of `blocks` (as ggml_block_rows returns them) of ggml type `type`, decoded to
// `dtype`: [rows, elements per row].
StatusOr<Tensor> decode_ggml_block_rows(const Tensor& blocks, int32_t type, DType dtype);

}  // namespace tessera
