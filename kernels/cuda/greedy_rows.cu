// Greedy verification on the device (Backend::greedy_rows): one block per row of logits finds
// the highest logit (ties to the lowest id, as the host sampler's argmax) and the row's
// log-softmax at it, the normaliser summed in double as kernels/cpu/sum_exp.h does, so only
// an id and a logprob per row go back to the host.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

constexpr int kRowThreads = 256;

// The better of two (value, id) candidates: the larger value, the lower id on a tie.
__device__ inline void take_better(float& v, int64_t& i, float ov, int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void greedy_rows_kernel(const float* logits, int64_t vocab, int32_t* ids, float* logprobs) {
  __shared__ float best_v[kRowThreads];
  __shared__ int64_t best_i[kRowThreads];
  __shared__ double sums[kRowThreads];
  const float* row = logits + blockIdx.x * vocab;
  const int t = threadIdx.x;
  // Each thread's best over its stride, then a tree over the block.
  float v = -INFINITY;
  int64_t i = vocab;  // no candidate yet: loses every tie
  for (int64_t k = t; k < vocab; k += blockDim.x) take_better(v, i, row[k], k);
  best_v[t] = v;
  best_i[t] = i;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      float bv = best_v[t];
      int64_t bi = best_i[t];
      take_better(bv, bi, best_v[t + s], best_i[t + s]);
      best_v[t] = bv;
      best_i[t] = bi;
    }
    __syncthreads();
  }
  const float mx = best_v[0];
  const int64_t best = best_i[0] < vocab ? best_i[0] : 0;  // a row of -inf / NaN: id 0, as the host
  double sum = 0;
  for (int64_t k = t; k < vocab; k += blockDim.x) sum += static_cast<double>(expf(row[k] - mx));
  sums[t] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) sums[t] += sums[t + s];
    __syncthreads();
  }
  if (t == 0) {
    ids[blockIdx.x] = static_cast<int32_t>(best);
    logprobs[blockIdx.x] = static_cast<float>(static_cast<double>(row[best]) - (static_cast<double>(mx) + log(sums[0])));
  }
}

}  // namespace

namespace launch {

void greedy_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* ids, float* logprobs, Stream stream) {
  if (rows == 0) return;
  greedy_rows_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, ids, logprobs);
}

}  // namespace launch
}  // namespace tessera::cuda
