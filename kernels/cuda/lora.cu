// Backend::lora_add on the device, the twin of kernels/cpu/lora_cpu.cc: one launch per
// segment, a block per row. The block shrinks its row into shared memory (a thread per rank
// index, summing the row's inputs in order), then expands it into out's row (a thread per
// output column, summing the rank in order), so each element's sums run in the CPU's order.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

__global__ void lora_rows_kernel(const float* x, int64_t x_stride, const float* a, const float* b, int64_t rank,
                                 int64_t in, int64_t n, float scale, float* out, int64_t out_stride) {
  extern __shared__ float t[];
  const float* xr = x + blockIdx.x * x_stride;
  for (int64_t k = threadIdx.x; k < rank; k += blockDim.x) {
    float sum = 0.0f;
    for (int64_t j = 0; j < in; ++j) sum += a[k * in + j] * xr[j];
    t[k] = sum;
  }
  __syncthreads();
  float* orow = out + blockIdx.x * out_stride;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < rank; ++k) sum += b[j * rank + k] * t[k];
    orow[j] += scale * sum;
  }
}

}  // namespace

namespace launch {

void lora_add_rows(const float* x, int64_t x_stride, const float* a, const float* b, int64_t rank, int64_t in,
                   int64_t n, float scale, float* out, int64_t out_stride, int64_t rows, Stream stream) {
  if (rows == 0) return;
  lora_rows_kernel<<<static_cast<unsigned>(rows), 256, static_cast<size_t>(rank) * sizeof(float), stream>>>(
      x, x_stride, a, b, rank, in, n, scale, out, out_stride);
}

}  // namespace launch
}  // namespace tessera::cuda
