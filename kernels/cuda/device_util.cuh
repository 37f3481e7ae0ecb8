#pragma once
// Small device helpers shared by the kernels (nvcc only).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"
#include "kernels/activation.h"

namespace tessera::cuda {

constexpr int kThreads = 256;
// Grid-stride kernels use at most this many blocks (several waves on any current GPU).
constexpr int64_t kMaxBlocks = 4096;

inline int blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b > kMaxBlocks) b = kMaxBlocks;
  if (b < 1) b = 1;
  return static_cast<int>(b);
}

// Element i of an f32/f16/bf16 array, widened to f32 (dtype is uniform across a launch, so
// the switch does not diverge).
__device__ __forceinline__ float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// An embedding lookup's row for token id `id` (`row`, less any row_offset) lies outside the
// table of `rows` rows: then its output row o is zeros and, for the whole vocabulary
// (row_offset < 0), the id is reported through error_flag (mapped host memory, int[2]: [0] =
// 1, [1] = the id; the host sees it after its next synchronisation). Every thread of the
// token's block calls it.
__device__ __forceinline__ bool outside_table(int32_t id, int64_t row, int64_t rows, int64_t row_offset, float* o,
                                              int64_t hidden, int* error_flag) {
  if (row >= 0 && row < rows) return false;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = 0.0f;
  if (row_offset < 0 && threadIdx.x == 0 && error_flag != nullptr) {
    *reinterpret_cast<volatile int*>(error_flag + 1) = id;
    __threadfence_system();
    *reinterpret_cast<volatile int*>(error_flag) = 1;
  }
  return true;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `shared` holds at least 33 values. Ends with a barrier, so it can be called repeatedly.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? shared[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) shared[32] = w;
  }
  __syncthreads();
  const T total = shared[32];
  __syncthreads();
  return total;
}

// The activations, kernels/cpu/activations.h's formulas in f32 (no fast-math: erfcf and expf are
// the accurate versions, an ulp or two from glibc's). The gelus are written without `1 + tanh`
// or `1 + erf`, which cancel for x below about -3 (activations.h says why, and the identities).
__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float u = 0.79788456f * x * (1.0f + 0.044715f * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float gelu_erf_f(float x) { return 0.5f * x * erfcf(x * -0.70710678118654752f); }

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// `act` is uniform across a launch, so the switch does not diverge.
__device__ __forceinline__ float activate_f(float x, Activation act) {
  switch (act) {
    case Activation::kGeluTanh: return gelu_tanh_f(x);
    case Activation::kGeluErf: return gelu_erf_f(x);
    case Activation::kSilu: return silu_f(x);
    case Activation::kNone: break;
  }
  return x;
}

}  // namespace tessera::cuda
