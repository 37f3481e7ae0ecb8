// Backend::lora_add on the device, the twin of kernels/cpu/lora_cpu.cc (f32 or bf16 factors,
// widened as read): one launch per segment, a block per row. The block shrinks its row into
// shared memory (a thread per rank index, summing each half of the row's inputs in order),
// then expands it into out's row (a thread per output column, summing the rank in order), so
// each element's sums run in the CPU's order.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

template <typename E>
__global__ void lora_rows_kernel(const float* x, int64_t x_stride, const E* shrink, const E* expand, int64_t rank,
                                 int64_t in, int64_t n, float scale, float* out, int64_t out_stride) {
  extern __shared__ float t[];
  const float* xr = x + blockIdx.x * x_stride;
  // Neighbouring threads read neighbouring rank indices (shrink is [in, rank]) and columns
  // (expand is [rank, n]): coalesced.
  for (int64_t k = threadIdx.x; k < rank; k += blockDim.x) {
    // The two halves of the inputs, each in order, then added: the CPU's order.
    const int64_t half = in / 2;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t j = 0; j < half; ++j) lo += to_f32(shrink[j * rank + k]) * xr[j];
    for (int64_t j = half; j < in; ++j) hi += to_f32(shrink[j * rank + k]) * xr[j];
    t[k] = lo + hi;
  }
  __syncthreads();
  float* orow = out + blockIdx.x * out_stride;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < rank; ++k) sum += to_f32(expand[k * n + j]) * t[k];
    orow[j] += scale * sum;
  }
}

}  // namespace

namespace launch {

void lora_add_rows(const float* x, int64_t x_stride, const void* shrink, const void* expand, bool bf16, int64_t rank,
                   int64_t in, int64_t n, float scale, float* out, int64_t out_stride, int64_t rows, Stream stream) {
  if (rows == 0) return;
  const unsigned blocks = static_cast<unsigned>(rows);
  const size_t shared = static_cast<size_t>(rank) * sizeof(float);
  if (bf16) {
    lora_rows_kernel<<<blocks, 256, shared, stream>>>(x, x_stride, static_cast<const __nv_bfloat16*>(shrink),
                                                      static_cast<const __nv_bfloat16*>(expand), rank, in, n, scale,
                                                      out, out_stride);
  } else {
    lora_rows_kernel<<<blocks, 256, shared, stream>>>(x, x_stride, static_cast<const float*>(shrink),
                                                      static_cast<const float*>(expand), rank, in, n, scale, out,
                                                      out_stride);
  }
}

}  // namespace launch
}  // namespace tessera::cuda
