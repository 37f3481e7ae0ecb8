// Rotary position embedding (rotate-half), in place. inv_freq is the model's table on the
// device, the very f32 values the CPU backend reads: a one-ulp difference there would be
// multiplied by positions in the thousands. With partial rotary (GPT-NeoX's rotary_pct)
// only the first 2 * rot_half dims of each head turn; the others are never written.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

// One block per (token, head); threads over the rotated half.
__global__ void rotary_kernel(float* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                              const int32_t* positions, const float* inv_freq, int64_t rot_half, float magnitude) {
  const int64_t t = blockIdx.x / heads, h = blockIdx.x % heads;
  float* v = x + t * row_stride + h * head_dim;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < rot_half; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    const float c = magnitude * cosf(angle), s = magnitude * sinf(angle);
    const float x0 = v[i], x1 = v[i + rot_half];
    v[i] = x0 * c - x1 * s;
    v[i + rot_half] = x1 * c + x0 * s;
  }
}

}  // namespace

namespace launch {

void rotary(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
            const int32_t* positions, const float* inv_freq, int64_t rot_half, float magnitude, Stream stream) {
  if (tokens * heads == 0 || rot_half == 0) return;
  const int threads = rot_half >= 64 ? 64 : 32;
  rotary_kernel<<<tokens * heads, threads, 0, stream>>>(x, heads, head_dim, row_stride, positions, inv_freq,
                                                        rot_half, magnitude);
}

}  // namespace launch
}  // namespace tessera::cuda
