// Coded bf16 weights (kernels/coded_bf16_layout.h; Backend::linear_coded_bf16) on CUDA: the CPU
// backend's twin, correct first and simple:
//  - gemv (M <= kCodedBf16GemvMaxRows): one warp per output row; lane l decodes inputs
//    l, l + 32, ... of the row (its code and low byte through coded_bf16_position, the high
//    byte from the row's table) and multiplies them with every x row of the launch in f32;
//    warp-shuffle reduction, then lane 0 adds the row's escapes, the bias and the activation.
//    x stays f32 here (the CPU rounds it to bf16; the op test allows for that).
//  - dequantize: the coded matrix -> f32 [N, K] in the backend's workspace (escapes patched
//    in by a second kernel, a thread per row), for cuBLAS at larger M.
//  - embedding: a coded table's rows gathered, a block per token (a tied LM head's table).
// Compiled in CI; run by tests/gpu/run.sh where a GPU is present.
#include "kernels/coded_bf16_layout.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

struct CodedRows {
  const uint8_t* body;
  const int32_t* side;
  CodedBf16Side layout;
  int64_t K, row_bytes;
};

__device__ __forceinline__ float coded_weight(const CodedRows& w, int64_t n, int64_t k) {
  const uint8_t* block = w.body + n * w.row_bytes + (k / kCodedBf16Block) * kCodedBf16BlockBytes;
  const int p = coded_bf16_position(static_cast<int>(k % kCodedBf16Block));
  const int code = (p % 2 == 0) ? (block[p / 2] & 0x0f) : (block[p / 2] >> 4);
  const uint8_t* table = reinterpret_cast<const uint8_t*>(w.side + w.layout.tables()) + n * kCodedBf16TableSize;
  const uint32_t bits = (static_cast<uint32_t>(table[code]) << 24) | (static_cast<uint32_t>(block[32 + p]) << 16);
  return __uint_as_float(bits);
}

template <int MT>
__global__ void gemv_coded_bf16_kernel(const float* __restrict__ x, int64_t M, CodedRows w, int64_t N,
                                       const float* __restrict__ bias, float* __restrict__ y, Activation act) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const int64_t K = w.K;
  float acc[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i] = 0.0f;
  for (int64_t k = lane; k < K; k += 32) {
    const float wv = coded_weight(w, n, k);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < M) acc[i] += wv * x[i * K + k];
    }
  }
  const int32_t e0 = w.side[w.layout.row_start() + n], e1 = w.side[w.layout.row_start() + n + 1];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    float v = acc[i];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0 && i < M) {
      for (int32_t e = e0; e < e1; ++e) {
        v += __int_as_float(w.side[w.layout.values() + e]) * x[i * K + w.side[w.layout.columns() + e]];
      }
      y[i * N + n] = activate_f(v + (bias != nullptr ? bias[n] : 0.0f), act);
    }
  }
}

__global__ void dequantize_coded_bf16_kernel(CodedRows w, int64_t N, float* __restrict__ out) {
  const int64_t total = N * w.K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = coded_weight(w, i / w.K, i % w.K);
  }
}

__global__ void patch_escapes_kernel(CodedRows w, int64_t N, float* __restrict__ out) {
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int32_t e = w.side[w.layout.row_start() + n]; e < w.side[w.layout.row_start() + n + 1]; ++e) {
      out[n * w.K + w.side[w.layout.columns() + e]] = __int_as_float(w.side[w.layout.values() + e]);
    }
  }
}

// One block per token: its row decoded by the block's threads, then its escapes by thread 0.
__global__ void embedding_coded_bf16_kernel(const int32_t* ids, CodedRows w, int64_t rows, int64_t row_offset,
                                            float* out, int* error_flag) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const int64_t row = static_cast<int64_t>(id) - (row_offset > 0 ? row_offset : 0);
  float* o = out + t * w.K;
  if (outside_table(id, row, rows, row_offset, o, w.K, error_flag)) return;
  for (int64_t i = threadIdx.x; i < w.K; i += blockDim.x) o[i] = coded_weight(w, row, i);
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int32_t e = w.side[w.layout.row_start() + row]; e < w.side[w.layout.row_start() + row + 1]; ++e) {
      o[w.side[w.layout.columns() + e]] = __int_as_float(w.side[w.layout.values() + e]);
    }
  }
}

CodedRows coded_rows(const uint8_t* body, const int32_t* side, int64_t side_elements, int64_t N, int64_t K) {
  return CodedRows{body, side, CodedBf16Side::of(N, side_elements), K, coded_bf16_row_bytes(K)};
}

}  // namespace

namespace launch {

void linear_coded_bf16_gemv(const float* x, int64_t M, int64_t K, const uint8_t* body, const int32_t* side,
                            int64_t side_elements, int64_t N, const float* bias, float* y, Activation act,
                            Stream stream) {
  if (M == 0 || N == 0) return;
  const dim3 block(32 * kWarpsPerBlock);
  const dim3 grid(static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const CodedRows w = coded_rows(body, side, side_elements, N, K);
  if (M <= 1) {
    gemv_coded_bf16_kernel<1><<<grid, block, 0, stream>>>(x, M, w, N, bias, y, act);
  } else if (M <= 4) {
    gemv_coded_bf16_kernel<4><<<grid, block, 0, stream>>>(x, M, w, N, bias, y, act);
  } else {
    gemv_coded_bf16_kernel<kCodedBf16GemvMaxRows><<<grid, block, 0, stream>>>(x, M, w, N, bias, y, act);
  }
}

void dequantize_coded_bf16(const uint8_t* body, const int32_t* side, int64_t side_elements, int64_t N, int64_t K,
                           float* out, Stream stream) {
  if (N == 0) return;
  const CodedRows w = coded_rows(body, side, side_elements, N, K);
  dequantize_coded_bf16_kernel<<<blocks_for(N * K), kThreads, 0, stream>>>(w, N, out);
  patch_escapes_kernel<<<blocks_for(N), kThreads, 0, stream>>>(w, N, out);
}

void embedding_coded_bf16(const int32_t* ids, int64_t tokens, const uint8_t* body, const int32_t* side,
                          int64_t side_elements, int64_t rows, int64_t hidden, int64_t row_offset, float* out,
                          int* error_flag, Stream stream) {
  if (tokens == 0 || hidden == 0) return;
  const CodedRows w = coded_rows(body, side, side_elements, rows, hidden);
  embedding_coded_bf16_kernel<<<tokens, hidden >= 256 ? 256 : 128, 0, stream>>>(ids, w, rows, row_offset, out,
                                                                                 error_flag);
}

}  // namespace launch
}  // namespace tessera::cuda
