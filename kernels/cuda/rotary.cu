// Rotary position embedding (rotate-half), in place. inv_freq comes from the host, computed
// by the same expression as the CPU backend: a one-ulp difference there would be
// multiplied by positions in the thousands.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

// One block per (token, head); threads over the half dimension.
__global__ void rotary_kernel(float* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                              const int32_t* positions, const float* inv_freq) {
  const int64_t t = blockIdx.x / heads, h = blockIdx.x % heads;
  const int64_t half = head_dim / 2;
  float* v = x + t * row_stride + h * head_dim;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle), s = sinf(angle);
    const float x0 = v[i], x1 = v[i + half];
    v[i] = x0 * c - x1 * s;
    v[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace

namespace launch {

void rotary(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
            const int32_t* positions, const float* inv_freq, Stream stream) {
  if (tokens * heads == 0 || head_dim == 0) return;
  const int threads = head_dim / 2 >= 64 ? 64 : 32;
  rotary_kernel<<<tokens * heads, threads, 0, stream>>>(x, heads, head_dim, row_stride, positions, inv_freq);
}

}  // namespace launch
}  // namespace tessera::cuda
