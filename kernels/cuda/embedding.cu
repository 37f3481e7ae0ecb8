// Embedding gather: one block per token copies (and widens) its table row.
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
  if (row < 0 || row >= rows) {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = 0.0f;
    if (row_offset < 0 && threadIdx.x == 0 && error_flag != nullptr) {
      // Mapped host memory: the host sees it after its next synchronisation.
      *reinterpret_cast<volatile int*>(error_flag + 1) = id;
      __threadfence_system();
      *reinterpret_cast<volatile int*>(error_flag) = 1;
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = load_as_f32(table, dtype, row * hidden + i);
}

}  // namespace

namespace launch {

void embedding(const int32_t* ids, int64_t tokens, const void* table, DType table_dtype, int64_t rows,
               int64_t hidden, int64_t row_offset, float* out, int* error_flag, Stream stream) {
  if (tokens == 0 || hidden == 0) return;
  embedding_kernel<<<tokens, hidden >= 256 ? 256 : 128, 0, stream>>>(ids, table, table_dtype, rows, hidden,
                                                                     row_offset, out, error_flag);
}

}  // namespace launch
}  // namespace tessera::cuda
