// Element-wise kernels: the GEMM input conversion and epilogue (bias + GELU-tanh), GELU,
// SiLU·mul and add. The activation formulas are kernels/cpu/activations.h's, in f32.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

__device__ __forceinline__ float gelu_tanh_f(float x) {
  return x * 0.5f * (1.0f + tanhf(0.79788456f * x * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

template <typename T>
__global__ void convert_kernel(const float* in, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_f32<T>(in[i]);
  }
}

__global__ void bias_gelu_kernel(float* out, int64_t rows, int64_t cols, const void* bias, DType bt, bool gelu) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = out[i];
    if (bias != nullptr) v += load_as_f32(bias, bt, i % cols);
    if (gelu) v = gelu_tanh_f(v);
    out[i] = v;
  }
}

__global__ void gelu_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = gelu_tanh_f(x[i]);
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t tokens, int64_t width,
                                int64_t in_stride, float* out) {
  const int64_t n = tokens * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    out[i] = silu_f(gate[t * in_stride + c]) * up[t * in_stride + c];
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

}  // namespace

namespace launch {

void convert_from_f32(const float* in, void* out, DType out_dtype, int64_t n, Stream stream) {
  if (n == 0) return;
  switch (out_dtype) {
    case DType::kF16:
      convert_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, static_cast<__half*>(out), n);
      break;
    case DType::kBF16:
      convert_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
      break;
    default:
      convert_kernel<<<blocks_for(n), kThreads, 0, stream>>>(in, static_cast<float*>(out), n);
      break;
  }
}

void bias_gelu(float* out, int64_t rows, int64_t cols, const void* bias, DType bias_dtype, bool gelu,
               Stream stream) {
  if (rows * cols == 0 || (bias == nullptr && !gelu)) return;
  bias_gelu_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(out, rows, cols, bias, bias_dtype, gelu);
}

void gelu_tanh(float* x, int64_t n, Stream stream) {
  if (n == 0) return;
  gelu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n);
}

void silu_mul(const float* gate, const float* up, int64_t tokens, int64_t width, int64_t in_stride, float* out,
              Stream stream) {
  if (tokens * width == 0) return;
  silu_mul_kernel<<<blocks_for(tokens * width), kThreads, 0, stream>>>(gate, up, tokens, width, in_stride, out);
}

void add(const float* a, const float* b, float* out, int64_t n, Stream stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, n);
}

}  // namespace launch
}  // namespace tessera::cuda
