// LayerNorm and RMSNorm, each optionally fused with the residual add before it, and the
// per-head RMSNorm of q and k (Qwen3, Gemma 3). One block per row (per head vector); the
// statistics are accumulated in double, as the CPU reference does, so the two backends
// agree to float rounding whatever the summation order.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

template <bool kResidual, bool kRms>
__global__ void norm_kernel(float* x, const float* delta, const void* gamma, DType gt, const void* beta,
                            DType bt, float eps, int64_t h, float* out) {
  __shared__ double shared[33];
  const int64_t row = blockIdx.x;
  float* xr = x + row * h;
  float* o = out + row * h;
  // Each thread touches the same indices in every pass, so the fused add needs no barrier.
  if (kResidual) {
    const float* d = delta + row * h;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) xr[i] += d[i];
  }
  if (kRms) {
    double ss = 0;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
    ss = block_sum(ss, shared);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(h) + eps));
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) o[i] = load_as_f32(gamma, gt, i) * (xr[i] * inv);
  } else {
    double sum = 0;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) sum += xr[i];
    const double mean = block_sum(sum, shared) / static_cast<double>(h);
    double var = 0;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      const double d = xr[i] - mean;
      var += d * d;
    }
    var = block_sum(var, shared) / static_cast<double>(h);
    const float inv = static_cast<float>(1.0 / sqrt(var + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      o[i] = (xr[i] - m) * inv * load_as_f32(gamma, gt, i) + load_as_f32(beta, bt, i);
    }
  }
}

// In place on one head vector v = x + t * row_stride + h * head_dim. Safe in place: each
// thread rewrites only the elements it read, after block_sum's barrier.
__global__ void head_rms_norm_kernel(float* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                                     const void* gamma, DType gt, float eps) {
  __shared__ double shared[33];
  const int64_t t = blockIdx.x / heads, h = blockIdx.x % heads;
  float* v = x + t * row_stride + h * head_dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) ss += static_cast<double>(v[i]) * v[i];
  ss = block_sum(ss, shared);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(head_dim) + eps));
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = load_as_f32(gamma, gt, i) * (v[i] * inv);
}

}  // namespace

namespace launch {

void norm(float* x, const float* delta, const void* gamma, DType gamma_dtype, const void* beta, DType beta_dtype,
          float eps, int64_t rows, int64_t hidden, float* out, Stream stream) {
  if (rows == 0 || hidden == 0) return;
  const int threads = hidden >= 1024 ? 256 : 128;
  const bool rms = beta == nullptr;
  auto kernel = delta != nullptr ? (rms ? norm_kernel<true, true> : norm_kernel<true, false>)
                                 : (rms ? norm_kernel<false, true> : norm_kernel<false, false>);
  kernel<<<rows, threads, 0, stream>>>(x, delta, gamma, gamma_dtype, beta, beta_dtype, eps, hidden, out);
}

void head_rms_norm(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
                   const void* gamma, DType gamma_dtype, float eps, Stream stream) {
  if (tokens * heads == 0 || head_dim == 0) return;
  // Head vectors are short (64..256): two to four warps each.
  const int threads = head_dim >= 256 ? 128 : 64;
  head_rms_norm_kernel<<<tokens * heads, threads, 0, stream>>>(x, heads, head_dim, row_stride, gamma, gamma_dtype,
                                                               eps);
}

}  // namespace launch
}  // namespace tessera::cuda
