// Embedding gather: one block per token copies (and widens) its table row, or decodes it from
// ggml blocks (an untied GGUF embedding kept as stored).
#include "common/gguf/ggml_block_element.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const void* table, DType dtype, int64_t rows, int64_t hidden,
                                 int64_t row_offset, float* out, int* error_flag) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const int64_t row = static_cast<int64_t>(id) - (row_offset > 0 ? row_offset : 0);
  float* o = out + t * hidden;
  if (outside_table(id, row, rows, row_offset, o, hidden, error_flag)) return;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = load_as_f32(table, dtype, row * hidden + i);
}

// A table in ggml blocks: each element decoded on its own (ggml_block_element.h).
__global__ void embedding_ggml_kernel(const int32_t* ids, const uint8_t* table, int64_t rows, int64_t row_bytes,
                                      uint32_t type, int64_t hidden, int64_t row_offset, float* out, int* error_flag) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const int64_t row = static_cast<int64_t>(id) - (row_offset > 0 ? row_offset : 0);
  float* o = out + t * hidden;
  if (outside_table(id, row, rows, row_offset, o, hidden, error_flag)) return;
  const uint8_t* r = table + row * row_bytes;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = ggml_element::row_element(type, r, i);
}

}  // namespace

namespace launch {

void embedding(const int32_t* ids, int64_t tokens, const void* table, DType table_dtype, int64_t rows,
               int64_t hidden, int64_t row_offset, float* out, int* error_flag, Stream stream) {
  if (tokens == 0 || hidden == 0) return;
  embedding_kernel<<<tokens, hidden >= 256 ? 256 : 128, 0, stream>>>(ids, table, table_dtype, rows, hidden,
                                                                     row_offset, out, error_flag);
}

void embedding_ggml(const int32_t* ids, int64_t tokens, const uint8_t* table, int64_t rows, int64_t row_bytes,
                    uint32_t ggml_type, int64_t hidden, int64_t row_offset, float* out, int* error_flag,
                    Stream stream) {
  if (tokens == 0 || hidden == 0) return;
  embedding_ggml_kernel<<<tokens, hidden >= 256 ? 256 : 128, 0, stream>>>(ids, table, rows, row_bytes, ggml_type,
                                                                          hidden, row_offset, out, error_flag);
}

}  // namespace launch
}  // namespace tessera::cuda
