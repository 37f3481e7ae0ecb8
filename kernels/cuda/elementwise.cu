// Element-wise kernels: the GEMM input conversion and epilogue (bias + activation), the
// in-place activation, the gated MLP product act(gate) * up, add, scale and soft-capping.
// The activation formulas are kernels/cpu/activations.h's, in f32 (no fast-math: erfcf
// and expf are the accurate versions, an ulp or two from glibc's).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

template <typename T>
__global__ void convert_kernel(const float* in, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_f32<T>(in[i]);
  }
}

__global__ void bias_act_kernel(float* out, int64_t rows, int64_t cols, const void* bias, DType bt,
                                Activation act) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = out[i];
    if (bias != nullptr) v += load_as_f32(bias, bt, i % cols);
    out[i] = activate_f(v, act);
  }
}

__global__ void activate_kernel(float* x, int64_t n, Activation act) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = activate_f(x[i], act);
  }
}

__global__ void gated_act_kernel(const float* gate, const float* up, int64_t tokens, int64_t width,
                                 int64_t in_stride, float* out, Activation act) {
  const int64_t n = tokens * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, c = i % width;
    out[i] = activate_f(gate[t * in_stride + c], act) * up[t * in_stride + c];
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= factor;
  }
}

// Divide, then tanh, then multiply: the CPU's expression (dividing by cap is not the same
// rounding as multiplying by 1 / cap).
__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
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

void bias_act(float* out, int64_t rows, int64_t cols, const void* bias, DType bias_dtype, Activation act,
              Stream stream) {
  if (rows * cols == 0 || (bias == nullptr && act == Activation::kNone)) return;
  bias_act_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(out, rows, cols, bias, bias_dtype, act);
}

void activate(float* x, int64_t n, Activation act, Stream stream) {
  if (n == 0 || act == Activation::kNone) return;
  activate_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, act);
}

void gated_act(const float* gate, const float* up, int64_t tokens, int64_t width, int64_t in_stride, float* out,
               Activation act, Stream stream) {
  if (tokens * width == 0) return;
  gated_act_kernel<<<blocks_for(tokens * width), kThreads, 0, stream>>>(gate, up, tokens, width, in_stride, out,
                                                                        act);
}

void add(const float* a, const float* b, float* out, int64_t n, Stream stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, out, n);
}

void scale(float* x, int64_t n, float factor, Stream stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, factor);
}

void softcap(float* x, int64_t n, float cap, Stream stream) {
  if (n == 0) return;
  softcap_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, cap);
}

}  // namespace launch
}  // namespace tessera::cuda
