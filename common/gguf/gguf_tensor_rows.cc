#include "common/gguf/gguf_tensor_rows.h"

#include <cstring>
#include <vector>

#include "common/gguf/ggml_dequant.h"
#include "common/gguf/gguf_file.h"

namespace tessera {

bool stored_in_ggml_blocks(const TensorInfo& info) {
  if (info.ggml_type < 0) return false;
  const auto type = static_cast<GgmlType>(info.ggml_type);
  return type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16;
}

bool needs_ggml_row_decoding(const TensorInfo& info) {
  if (info.ggml_type < 0) return false;
  return stored_in_ggml_blocks(info) || !info.row_order.empty() || info.value_offset != 0.0f;
}

namespace {

// A 1-D tensor whose elements the converter permuted (Llama's q/k biases): each element is a
// row of its own.
StatusOr<Tensor> decode_reordered_vector(const TensorInfo& info, DType dtype, int axis, int64_t begin, int64_t count) {
  const int64_t n = info.shape[0];
  if (static_cast<int64_t>(info.row_order.size()) != n) {
    return internal_error(info.file + ": tensor '" + info.name + "' has a row order of the wrong length");
  }
  std::vector<float> stored(static_cast<size_t>(n)), logical;
  TESSERA_RETURN_IF_ERROR(dequantize_ggml(static_cast<uint32_t>(info.ggml_type),
                                          static_cast<const uint8_t*>(info.data), n, stored.data()));
  const int64_t first = axis < 0 ? 0 : begin, len = axis < 0 ? n : count;
  for (int64_t i = first; i < first + len; ++i)
    logical.push_back(stored[static_cast<size_t>(info.row_order[static_cast<size_t>(i)])] + info.value_offset);
  Tensor out = Tensor::zeros({len}, dtype);
  convert_elements(logical.data(), DType::kF32, out.data<char>(), dtype, static_cast<size_t>(len));
  return out;
}

}  // namespace

StatusOr<Tensor> decode_ggml_rows(const TensorInfo& info, DType dtype, int axis, int64_t begin, int64_t count) {
  const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(info.ggml_type));
  if (traits == nullptr || info.shape.empty()) return internal_error(info.file + ": tensor '" + info.name + "' is not a ggml tensor");
  const int nd = static_cast<int>(info.shape.size());
  if (nd == 1 && !info.row_order.empty()) return decode_reordered_vector(info, dtype, axis, begin, count);
  const int64_t row_len = info.shape[nd - 1];
  const int64_t row_bytes = row_len / traits->block_elems * traits->block_bytes;
  std::vector<int64_t> out_dims = info.shape;
  if (axis >= 0) out_dims[axis] = count;
  // The logical rows to read, in output order: all rows for a column slice (axis nd - 1).
  const bool by_rows = axis >= 0 && axis < nd - 1;
  int64_t inner = 1;  // rows after `axis`, for a slice of rows
  if (by_rows)
    for (int i = axis + 1; i < nd - 1; ++i) inner *= info.shape[i];
  int64_t num_rows = 1;
  for (int i = 0; i + 1 < nd; ++i) num_rows *= out_dims[i];
  const int64_t col_begin = axis == nd - 1 ? begin : 0;
  const int64_t cols = out_dims[nd - 1];

  Tensor out = Tensor::zeros(out_dims, dtype);
  char* dst = out.data<char>();
  const size_t dst_row_bytes = static_cast<size_t>(cols) * dtype_size(dtype);
  const auto* src = static_cast<const uint8_t*>(info.data);
  // Rows are independent: threads decode them in parallel (a large embedding or LM head is
  // most of a quantized file's load time). The type was validated when the file was opened,
  // so dequantize_ggml fails only on a bug; the first failure is returned.
  Status failed = Status::ok();
#pragma omp parallel if (num_rows * row_len >= (int64_t{1} << 20))
  {
    std::vector<float> row(static_cast<size_t>(row_len));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < num_rows; ++r) {
      int64_t logical = r;
      if (by_rows) {
        const int64_t o = r / (count * inner), a = r / inner % count, i = r % inner;
        logical = (o * info.shape[axis] + begin + a) * inner + i;
      }
      const int64_t stored = info.row_order.empty() ? logical : info.row_order[static_cast<size_t>(logical)];
      Status st = dequantize_ggml(static_cast<uint32_t>(info.ggml_type), src + stored * row_bytes, row_len, row.data());
      if (!st.is_ok()) {
#pragma omp critical(tessera_decode_ggml_rows)
        if (failed.is_ok()) failed = std::move(st);
        continue;
      }
      if (info.value_offset != 0.0f)
        for (float& v : row) v += info.value_offset;
      convert_elements(row.data() + col_begin, DType::kF32, dst + r * dst_row_bytes, dtype, static_cast<size_t>(cols));
    }
  }
  TESSERA_RETURN_IF_ERROR(failed);
  return out;
}

StatusOr<Tensor> ggml_block_rows(const TensorInfo& info, int axis, int64_t begin, int64_t count,
                                 RecycledBuffers* scratch) {
  const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(info.ggml_type));
  if (traits == nullptr || info.shape.size() != 2 || info.value_offset != 0.0f) {
    return internal_error(info.file + ": tensor '" + info.name + "' cannot be read as rows of ggml blocks");
  }
  const int64_t rows = info.shape[0], row_len = info.shape[1];
  const int64_t row_bytes = row_len / traits->block_elems * traits->block_bytes;
  const int64_t row_begin = axis == 0 ? begin : 0, row_count = axis == 0 ? count : rows;
  const int64_t col_begin = axis == 1 ? begin : 0, col_count = axis == 1 ? count : row_len;
  if (col_begin % traits->block_elems != 0 || col_count % traits->block_elems != 0) {
    return invalid_argument("tensor '" + info.name + "' (" + traits->name + ", blocks of " +
                            std::to_string(traits->block_elems) + " inputs) cannot be split at inputs [" +
                            std::to_string(col_begin) + ", " + std::to_string(col_begin + col_count) +
                            "): the split falls inside a block");
  }
  const int64_t offset = col_begin / traits->block_elems * traits->block_bytes;
  const int64_t bytes = col_count / traits->block_elems * traits->block_bytes;
  Tensor out = scratch != nullptr ? scratch->take({row_count, bytes}, DType::kU8)
                                  : Tensor::zeros({row_count, bytes}, DType::kU8);
  const auto* src = static_cast<const uint8_t*>(info.data);
  for (int64_t r = 0; r < row_count; ++r) {
    const int64_t logical = row_begin + r;
    const int64_t stored = info.row_order.empty() ? logical : info.row_order[static_cast<size_t>(logical)];
    std::memcpy(out.data<uint8_t>() + r * bytes, src + stored * row_bytes + offset, static_cast<size_t>(bytes));
  }
  return out;
}

StatusOr<Tensor> decode_ggml_block_rows(const Tensor& blocks, int32_t type, DType dtype) {
  const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (traits == nullptr || blocks.view().ndim != 2 || blocks.dim(1) % traits->block_bytes != 0) {
    return internal_error("rows of ggml blocks of an unknown type or size");
  }
  const int64_t rows = blocks.dim(0), row_len = blocks.dim(1) / traits->block_bytes * traits->block_elems;
  Tensor out = Tensor::zeros({rows, row_len}, dtype);
  Status failed = Status::ok();
#pragma omp parallel if (rows * row_len >= (int64_t{1} << 20))
  {
    std::vector<float> row(static_cast<size_t>(row_len));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      Status st =
          dequantize_ggml(static_cast<uint32_t>(type), blocks.data<uint8_t>() + r * blocks.dim(1), row_len, row.data());
      if (!st.is_ok()) {
#pragma omp critical(tessera_decode_ggml_rows)
        if (failed.is_ok()) failed = std::move(st);
        continue;
      }
      convert_elements(row.data(), DType::kF32,
                       out.data<char>() + r * row_len * static_cast<int64_t>(dtype_size(dtype)), dtype,
                       static_cast<size_t>(row_len));
    }
  }
  TESSERA_RETURN_IF_ERROR(failed);
  return out;
}

}  // namespace tessera
