// Int8 weight-only linear layer (Backend::linear_int8, docs/quantization.md): w int8 [N, K]
// with one f32 scale per group of consecutive inputs of each row; x and y f32.
//  - gemv (M <= kInt8GemvMaxRows): one warp per output row, each lane reading 4 int8 at a
//    time (char4) and every x row of the launch against them, so a weight is read from
//    memory once per launch; a group is a multiple of 32 so a lane's 4 inputs share one
//    scale. Warp-shuffle reduction, then bias and activation by lane 0 (the bias_act
//    epilogue is not needed).
//  - dequantize: w -> f32 [N, K] in the backend's workspace, for cuBLAS's f32 GEMM at larger M
//    (compute bound; the f32 GEMM gives the CPU backend's numerics).
// tests/gpu/run.sh checks it against the CPU (passed on an H200, docs/gpu-status.md).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <int MT>
__global__ void gemv_int8_kernel(const float* __restrict__ x, int64_t M, int64_t K, const int8_t* __restrict__ w,
                                 const float* __restrict__ scales, int64_t group, int64_t N,
                                 const float* __restrict__ bias, float* __restrict__ y, Activation act) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const int64_t groups = K / group;
  const int8_t* row = w + n * K;
  const float* srow = scales + n * groups;
  float acc[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i] = 0.0f;
  // K is a multiple of 32 (a group is), so of 4: every lane reads whole char4s.
  for (int64_t k = static_cast<int64_t>(lane) * 4; k < K; k += 128) {
    const char4 q = *reinterpret_cast<const char4*>(row + k);
    const float s = srow[k / group];
    const float w0 = q.x * s, w1 = q.y * s, w2 = q.z * s, w3 = q.w * s;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < M) {
        const float4 xv = *reinterpret_cast<const float4*>(x + i * K + k);
        acc[i] += w0 * xv.x + w1 * xv.y + w2 * xv.z + w3 * xv.w;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    float v = acc[i];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0 && i < M) y[i * N + n] = activate_f(v + (bias != nullptr ? bias[n] : 0.0f), act);
  }
}

__global__ void dequantize_int8_kernel(const int8_t* __restrict__ w, const float* __restrict__ scales, int64_t group,
                                       int64_t N, int64_t K, float* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K) return;
  const int64_t n = i / K, k = i % K;
  out[i] = static_cast<float>(w[i]) * scales[n * (K / group) + k / group];
}

}  // namespace

namespace launch {

void linear_int8_gemv(const float* x, int64_t M, int64_t K, const int8_t* w, const float* scales, int64_t group,
                      int64_t N, const float* bias, float* y, Activation act, Stream stream) {
  if (M == 0 || N == 0) return;
  const dim3 block(32 * kWarpsPerBlock);
  const dim3 grid(static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock));
  // x rows must be float4-aligned: K % 4 == 0 (K is a multiple of the group) and the
  // allocator's blocks are 256-byte aligned.
  if (M <= 1) {
    gemv_int8_kernel<1><<<grid, block, 0, stream>>>(x, M, K, w, scales, group, N, bias, y, act);
  } else if (M <= 4) {
    gemv_int8_kernel<4><<<grid, block, 0, stream>>>(x, M, K, w, scales, group, N, bias, y, act);
  } else {
    gemv_int8_kernel<kInt8GemvMaxRows><<<grid, block, 0, stream>>>(x, M, K, w, scales, group, N, bias, y, act);
  }
}

void dequantize_int8(const int8_t* w, const float* scales, int64_t group, int64_t N, int64_t K, float* out,
                     Stream stream) {
  const int64_t n = N * K;
  if (n == 0) return;
  const int threads = 256;
  dequantize_int8_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      w, scales, group, N, K, out);
}

}  // namespace launch
}  // namespace tessera::cuda
