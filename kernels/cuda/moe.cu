// Mixture-of-experts helpers: router top-k, and the row gather/scatter that moves token
// rows to and from an expert's batch.
#include <cfloat>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

// One thread per token (routers have tens of experts). Probabilities are computed as the
// CPU does (max, exp, one sequential sum, divide) and recomputed on the fly rather than
// stored, so any expert count works without local arrays. The k-th pick is the best
// expert strictly after the (k-1)-th in the order (probability descending, id ascending):
// exactly what the CPU's stable sort yields, ties included. normalize: the k weights are
// divided by their sum (Mixtral); else they stay the softmax probabilities (Qwen2-MoE).
__global__ void moe_topk_kernel(const float* logits, int64_t tokens, int64_t experts, int top_k, bool normalize,
                                float* weights, int32_t* ids) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + t * experts;
  float mx = -FLT_MAX;
  for (int64_t e = 0; e < experts; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < experts; ++e) sum += expf(l[e] - mx);
  float prev_p = FLT_MAX;
  int64_t prev_id = -1;
  float chosen = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    int64_t best = -1;
    float best_p = 0.0f;
    for (int64_t e = 0; e < experts; ++e) {
      const float p = expf(l[e] - mx) / sum;
      const bool after = p < prev_p || (p == prev_p && e > prev_id);
      if (after && (best < 0 || p > best_p)) {
        best = e;
        best_p = p;
      }
    }
    if (best < 0) {  // NaN logits: keep the ids valid and distinct
      best = k;
      best_p = 0.0f;
    }
    weights[t * top_k + k] = best_p;
    ids[t * top_k + k] = static_cast<int32_t>(best);
    chosen += best_p;
    prev_p = best_p;
    prev_id = best;
  }
  if (normalize) {
    for (int k = 0; k < top_k; ++k) weights[t * top_k + k] /= chosen;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t hidden, float* out) {
  const int64_t i = blockIdx.x;
  const float* src = x + static_cast<int64_t>(rows[i]) * hidden;
  float* dst = out + i * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = src[j];
}

// Distinct rows: every (i, j) is its own element. __fmul_rn/__fadd_rn keep nvcc from
// contracting into an FMA, so the result is the CPU's bit for bit.
__global__ void scatter_unique_kernel(const float* x, const int32_t* rows, const float* scale, int64_t hidden,
                                      float* out) {
  const int64_t i = blockIdx.x;
  float* dst = out + static_cast<int64_t>(rows[i]) * hidden;
  const float* src = x + i * hidden;
  const float s = scale[i];
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) dst[j] = __fadd_rn(dst[j], __fmul_rn(s, src[j]));
}

// Repeated rows: one thread per column adds the rows in order.
__global__ void scatter_ordered_kernel(const float* x, const int32_t* rows, const float* scale, int64_t n_rows,
                                       int64_t hidden, float* out) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < hidden;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t i = 0; i < n_rows; ++i) {
      float* dst = out + static_cast<int64_t>(rows[i]) * hidden + j;
      *dst = __fadd_rn(*dst, __fmul_rn(scale[i], x[i * hidden + j]));
    }
  }
}

}  // namespace

namespace launch {

void moe_topk(const float* logits, int64_t tokens, int64_t experts, int top_k, bool normalize, float* weights,
              int32_t* ids, Stream stream) {
  if (tokens == 0) return;
  const int threads = 128;
  const int64_t blocks = (tokens + threads - 1) / threads;
  moe_topk_kernel<<<blocks, threads, 0, stream>>>(logits, tokens, experts, top_k, normalize, weights, ids);
}

void gather_rows(const float* x, const int32_t* rows, int64_t n_rows, int64_t hidden, float* out, Stream stream) {
  if (n_rows == 0 || hidden == 0) return;
  gather_rows_kernel<<<n_rows, hidden >= 256 ? 256 : 128, 0, stream>>>(x, rows, hidden, out);
}

void scatter_add_scaled(const float* x, const int32_t* rows, const float* scale, int64_t n_rows, int64_t hidden,
                        bool rows_unique, float* out, Stream stream) {
  if (n_rows == 0 || hidden == 0) return;
  if (rows_unique) {
    scatter_unique_kernel<<<n_rows, hidden >= 256 ? 256 : 128, 0, stream>>>(x, rows, scale, hidden, out);
  } else {
    scatter_ordered_kernel<<<blocks_for(hidden), kThreads, 0, stream>>>(x, rows, scale, n_rows, hidden, out);
  }
}

}  // namespace launch
}  // namespace tessera::cuda
