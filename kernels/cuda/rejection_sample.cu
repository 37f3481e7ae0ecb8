// Speculative sampling's check on the device (Backend::rejection_sample_rows), the twin of
// kernels/cpu/rejection_sample.cc: one block per row. The row sums of p and q are taken in
// double; a rejected row's residual max(0, p - q) is summed per thread over a contiguous
// chunk of ids, so thread 0 finds the chunk the draw lands in from the chunk sums and walks
// only that chunk — the ids in order, as the CPU walks them.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

constexpr int kRowThreads = 256;

// Sum of `part` over the block (every thread passes its own; the result is in parts[0]).
__device__ double block_sum(double part, double* parts) {
  const int t = threadIdx.x;
  parts[t] = part;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) parts[t] += parts[t + s];
    __syncthreads();
  }
  const double total = parts[0];
  __syncthreads();
  return total;
}

struct RowWeights {
  const float* p;
  const float* q;
  double inv_p, inv_q;
  bool from_p;  // draw from p itself (no residual left)
  __device__ double operator()(int64_t i) const {
    const double pi = p[i] * inv_p;
    return from_p ? pi : fmax(0.0, pi - q[i] * inv_q);
  }
};

__global__ void rejection_sample_kernel(const float* p_all, const float* q_all, int64_t vocab, const int32_t* proposals,
                                        const int64_t* uniforms, int32_t* tokens, int32_t* accepted) {
  __shared__ double parts[kRowThreads];
  __shared__ double chunk_sums[kRowThreads];
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x;
  RowWeights w{p_all + r * vocab, q_all + r * vocab, 0.0, 0.0, false};
  const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(vocab, t * chunk), end = min(vocab, begin + chunk);
  double sp = 0, sq = 0;
  for (int64_t i = begin; i < end; ++i) {
    sp += w.p[i];
    sq += w.q[i];
  }
  const double sum_p = block_sum(sp, parts), sum_q = block_sum(sq, parts);
  w.inv_p = sum_p > 0 ? 1.0 / sum_p : 0.0;
  w.inv_q = sum_q > 0 ? 1.0 / sum_q : 0.0;
  const double u = static_cast<double>(uniforms[2 * r]) * 0x1.0p-53;
  const double v = static_cast<double>(uniforms[2 * r + 1]) * 0x1.0p-53;
  const int32_t x = proposals[r];
  if (x >= 0 && x < vocab) {
    const double p_x = w.p[x] * w.inv_p, q_x = w.q[x] * w.inv_q;
    if (q_x > 0 && u * q_x < p_x) {  // the same verdict in every thread
      if (t == 0) {
        tokens[r] = x;
        accepted[r] = 1;
      }
      return;
    }
  }
  double mine = 0;
  for (int64_t i = begin; i < end; ++i) mine += w(i);
  double total = block_sum(mine, parts);
  if (!(total > 0)) {
    w.from_p = true;
    mine = 0;
    for (int64_t i = begin; i < end; ++i) mine += w(i);
    total = block_sum(mine, parts);
  }
  chunk_sums[t] = mine;
  __syncthreads();
  if (t != 0) return;
  // The chunk holding the draw, then the id within it; a draw past the end (rounding) lands on
  // the last id with weight.
  const double target = v * total;
  double acc = 0;
  int last_chunk = -1;
  for (int c = 0; c < blockDim.x; ++c) {
    if (!(chunk_sums[c] > 0)) continue;
    last_chunk = c;
    if (!(target < acc + chunk_sums[c])) {
      acc += chunk_sums[c];
      continue;
    }
    const int64_t cb = c * chunk, ce = min(vocab, cb + chunk);
    for (int64_t i = cb; i < ce; ++i) {
      acc += w(i);
      if (target < acc) {
        tokens[r] = static_cast<int32_t>(i);
        accepted[r] = 0;
        return;
      }
    }
  }
  int64_t last = 0;
  if (last_chunk >= 0)
    for (int64_t i = last_chunk * chunk, ce = min(vocab, i + chunk); i < ce; ++i)
      if (w(i) > 0) last = i;
  tokens[r] = static_cast<int32_t>(last);
  accepted[r] = 0;
}

}  // namespace

namespace launch {

void rejection_sample_rows(const float* p, const float* q, int64_t rows, int64_t vocab, const int32_t* proposals,
                           const int64_t* uniforms, int32_t* tokens, int32_t* accepted, Stream stream) {
  if (rows == 0) return;
  rejection_sample_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(p, q, vocab, proposals, uniforms,
                                                                                    tokens, accepted);
}

}  // namespace launch
}  // namespace tessera::cuda
