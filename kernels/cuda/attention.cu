// Paged causal attention, prefill and decode rows in one kernel. One block per (query
// token, query head); its warps take the keys first..pos round-robin (first = 0, or with a
// sliding window max(0, pos - window + 1): keys before it are never read, so their blocks
// may already be freed and their table entries -1). Each warp computes one score at a time
// (lanes split head_dim, coalesced reads of the cached row), keeps an online softmax
// (running max, sum and weighted V in registers) and the warps' partial results are merged
// at the end. Keys are read through the sequence's block table; the cache is f32, f16 or
// bf16, widened in registers. GQA: query head h reads cached KV head (q_head_offset + h) /
// group - kv_head_offset. Scores in the CPU's order: scale, then the soft cap
// softcap * tanh(s / softcap) (Gemma 2), then ALiBi's slope[h] * key position.
//
// Correct first, not fast: no tiling of several query rows over one key load (flash-style
// prefill), no split-K over long contexts for decode. Those come with the tuning work.
#include <cfloat>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launchers.h"

namespace tessera::cuda {
namespace {

constexpr int kWarps = 4;

// kPer: head_dim values per lane (head_dim <= 32 * kPer).
template <typename T, int kPer>
__global__ void __launch_bounds__(kWarps * 32)
    paged_attention_kernel(launch::PagedAttentionArgs a) {
  __shared__ float s_max[kWarps], s_sum[kWarps];
  __shared__ float s_acc[kWarps][32 * kPer];
  const int64_t token = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t D = a.head_dim;
  const int32_t seq = a.token_seq[token];
  const int32_t pos = a.token_pos[token];
  const int32_t first = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int64_t g = (a.q_head_offset + h) / a.group - a.kv_head_offset;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const float slope = a.alibi_slopes != nullptr ? a.alibi_slopes[h] : 0.0f;
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);

  float q[kPer], acc[kPer];
  const float* qrow = a.q + token * a.q_row_stride + h * D;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int64_t d = lane + 32 * r;
    q[r] = d < D ? qrow[d] : 0.0f;
    acc[r] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;  // -FLT_MAX, not -inf: exp(m - m_new) stays well defined
  for (int32_t j = first + warp; j <= pos; j += kWarps) {
    const int64_t slot = static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    const int64_t base = (slot * a.kv_heads + g) * D;
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int64_t d = lane + 32 * r;
      if (d < D) dot += q[r] * to_f32(kc[base + d]);
    }
    dot = warp_sum(dot);
    float score = dot * a.scale;
    if (a.softcap > 0.0f) score = a.softcap * tanhf(score / a.softcap);
    if (a.alibi_slopes != nullptr) score += slope * static_cast<float>(j);
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);
    const float p = expf(score - m_new);
    l = l * correction + p;
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int64_t d = lane + 32 * r;
      const float v = d < D ? to_f32(vc[base + d]) : 0.0f;
      acc[r] = acc[r] * correction + p * v;
    }
    m = m_new;
  }
  // Merge the warps: a warp that saw no key has l = 0 and a weight of exp(-FLT_MAX - M) = 0.
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = l;
  }
#pragma unroll
  for (int r = 0; r < kPer; ++r) s_acc[warp][lane + 32 * r] = acc[r];
  __syncthreads();
  float big = -FLT_MAX;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, s_max[w]);
  float total = 0.0f;
  float weight[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = s_sum[w] > 0.0f ? expf(s_max[w] - big) : 0.0f;
    total += s_sum[w] * weight[w];
  }
  const float inv = 1.0f / total;
  float* orow = a.out + token * a.q_heads * D + h * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][d] * weight[w];
    orow[d] = o * inv;
  }
}

template <typename T>
void launch_typed(const launch::PagedAttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.q_heads));
  const int per = static_cast<int>((a.head_dim + 31) / 32);
  if (per <= 1) {
    paged_attention_kernel<T, 1><<<grid, kWarps * 32, 0, stream>>>(a);
  } else if (per <= 2) {
    paged_attention_kernel<T, 2><<<grid, kWarps * 32, 0, stream>>>(a);
  } else if (per <= 4) {
    paged_attention_kernel<T, 4><<<grid, kWarps * 32, 0, stream>>>(a);
  } else {
    paged_attention_kernel<T, 8><<<grid, kWarps * 32, 0, stream>>>(a);
  }
}

}  // namespace

namespace launch {

void paged_attention(const PagedAttentionArgs& args, Stream stream) {
  if (args.tokens == 0 || args.q_heads == 0 || args.head_dim == 0) return;
  switch (args.cache_dtype) {
    case DType::kF16: return launch_typed<__half>(args, stream);
    case DType::kBF16: return launch_typed<__nv_bfloat16>(args, stream);
    default: return launch_typed<float>(args, stream);
  }
}

}  // namespace launch
}  // namespace tessera::cuda
