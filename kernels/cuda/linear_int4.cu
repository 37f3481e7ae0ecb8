// Low-bit (4-, 5- and 6-bit) weight-only linear layer (Backend::linear_int4) on the panels of
// kernels/int4_layout.h; x and y f32. The CPU backend's twin, correct first and simple:
//  - gemv (M <= kInt4GemvMaxRows): one warp per output column; lane l reads the column's 4
//    q values of steps l, l + 32, ... (4 nibble bytes each, one per input, and for the 5- and
//    6-bit schemes 4 bytes of top bits) and forms
//    w = s * q - m with the group's s and m exactly as the CPU's dequantize_int4 does, then
//    f32 products with every x row of the launch. Warp-shuffle reduction, bias and activation
//    by lane 0. x stays f32 here (the CPU quantizes it to 8 bits per group; its op test in
//    tests/kernels/cuda_linear_int4_test.cc allows for that).
//  - dequantize: the panels -> f32 [N, K] in the backend's workspace, for cuBLAS at larger M.
// Compiled in CI; run by tests/gpu/run.sh where a GPU is present.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/int4_layout.h"

namespace tessera::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Column c (< 32) of a panel's record `rec`: s and m of the weight group of input k.
__device__ __forceinline__ void group_scale(Int4Scheme scheme, const uint8_t* rec, int64_t k, int c, float* s,
                                            float* m) {
  auto f16 = [](const uint8_t* at, int64_t i) { return __half2float(reinterpret_cast<const __half*>(at)[i]); };
  if (scheme == Int4Scheme::kSymmetric || scheme == Int4Scheme::kSymmetric5) {
    *s = f16(rec, (k / kInt4Group) * kInt4PanelColumns + c);
    *m = (scheme == Int4Scheme::kSymmetric ? 8.0f : 16.0f) * *s;
  } else if (scheme == Int4Scheme::kAsymmetric || scheme == Int4Scheme::kAsymmetric5) {
    const uint8_t* r = rec + (k / kInt4Group) * 128;
    *s = f16(r, c);
    *m = f16(r + 64, c);
  } else if (scheme == Int4Scheme::kSixBit) {
    const uint8_t* r = rec + (k / kInt4SuperBlock) * kSixBitRecordBytes;
    const int64_t sub = (k / kSixBitGroup) % 16;
    *s = f16(r, c) * static_cast<float>(static_cast<int8_t>(r[64 + sub * 32 + c]));
    *m = 32.0f * *s;
  } else {
    const uint8_t* r = rec + (k / kInt4SuperBlock) * kInt4SuperRecordBytes;
    const int64_t sub = (k / kInt4Group) % 8;
    *s = f16(r, c) * static_cast<float>(r[128 + sub * 32 + c]);
    *m = f16(r + 64, c) * static_cast<float>(r[384 + sub * 32 + c]);
  }
}

// A launch's panels: where they are and how far apart (int4_panel_stride and
// int4_record_stride, computed on the host), and the top bits per weight.
struct Panels {
  Int4Scheme scheme;
  const uint8_t* nibbles;
  const uint8_t* scales;
  int64_t step_bytes, panel_stride, record_stride;
  int top_bits;
};

Panels panels_of(Int4Scheme scheme, const uint8_t* nibbles, const uint8_t* scales, int64_t K) {
  return Panels{scheme,
                nibbles,
                scales,
                int4_step_bytes(scheme),
                int4_panel_stride(scheme, K),
                int4_record_stride(scheme, K),
                int4_top_bits(scheme)};
}

// The 4 weights of column n at inputs 4t .. 4t + 3 (one weight group: groups are 16 or 32).
__device__ __forceinline__ float4 weights4(const Panels& w, int64_t n, int64_t t) {
  const int64_t p = n / kInt4PanelColumns;
  const int c = static_cast<int>(n % kInt4PanelColumns);
  const uint8_t* rec = w.scales + p * w.record_stride;
  const uint8_t* step = w.nibbles + p * w.panel_stride + t * w.step_bytes;
  const uint32_t bytes = *reinterpret_cast<const uint32_t*>(step + 4 * (c % 16));
  // Top bits: 2 at bit 2 (c / 8) of the word of column c % 8, or 1 at bit c / 4 of that of c % 4.
  uint32_t top = 0, top_mask = 0;
  int top_shift = 0;
  if (w.top_bits == 2) {
    top = *reinterpret_cast<const uint32_t*>(step + 64 + 4 * (c % 8));
    top_shift = 2 * (c / 8);
    top_mask = 0x03;
  } else if (w.top_bits == 1) {
    top = *reinterpret_cast<const uint32_t*>(step + 64 + 4 * (c % 4));
    top_shift = c / 4;
    top_mask = 0x01;
  }
  const int shift = c < 16 ? 0 : 4;
  float s, m;
  group_scale(w.scheme, rec, 4 * t, c, &s, &m);
  auto value = [&](int i) {
    const uint32_t q = ((bytes >> (8 * i + shift)) & 0x0f) | (((top >> (8 * i + top_shift)) & top_mask) << 4);
    return s * static_cast<float>(q) - m;
  };
  return make_float4(value(0), value(1), value(2), value(3));
}

template <int MT>
__global__ void gemv_int4_kernel(const float* __restrict__ x, int64_t M, int64_t K, Panels w, int64_t N,
                                 const float* __restrict__ bias, float* __restrict__ y, Activation act) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  float acc[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i] = 0.0f;
  for (int64_t t = lane; t < K / 4; t += 32) {
    const float4 wv = weights4(w, n, t);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < M) {
        const float4 xv = *reinterpret_cast<const float4*>(x + i * K + 4 * t);
        acc[i] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
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

__global__ void dequantize_int4_kernel(Panels w, int64_t N, int64_t K, float* __restrict__ out) {
  const int64_t steps = N * (K / 4);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < steps;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / (K / 4), t = i % (K / 4);
    *reinterpret_cast<float4*>(out + n * K + 4 * t) = weights4(w, n, t);
  }
}

}  // namespace

namespace launch {

void linear_int4_gemv(const float* x, int64_t M, int64_t K, Int4Scheme scheme, const uint8_t* nibbles,
                      const uint8_t* scales, int64_t N, const float* bias, float* y, Activation act, Stream stream) {
  if (M == 0 || N == 0) return;
  const dim3 block(32 * kWarpsPerBlock);
  const dim3 grid(static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const Panels w = panels_of(scheme, nibbles, scales, K);
  if (M <= 1) {
    gemv_int4_kernel<1><<<grid, block, 0, stream>>>(x, M, K, w, N, bias, y, act);
  } else if (M <= 4) {
    gemv_int4_kernel<4><<<grid, block, 0, stream>>>(x, M, K, w, N, bias, y, act);
  } else {
    gemv_int4_kernel<kInt4GemvMaxRows><<<grid, block, 0, stream>>>(x, M, K, w, N, bias, y, act);
  }
}

void dequantize_int4(Int4Scheme scheme, const uint8_t* nibbles, const uint8_t* scales, int64_t N, int64_t K,
                     float* out, Stream stream) {
  const int64_t steps = N * (K / 4);
  if (steps == 0) return;
  dequantize_int4_kernel<<<blocks_for(steps), kThreads, 0, stream>>>(panels_of(scheme, nibbles, scales, K), N, K,
                                                                     out);
}

}  // namespace launch
}  // namespace tessera::cuda
