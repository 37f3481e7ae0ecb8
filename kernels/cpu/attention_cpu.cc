// Paged causal attention on the CPU. Every new token of every sequence attends to the keys
// at positions 0..its own position (the last `window` of them with a sliding window), read
// through the sequence's block table; with ALiBi the score of key j gets slope_h * j added
// (BLOOM's bias; softmax is shift-invariant, so this equals the slope * (j - i) form).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace tessera {

namespace {

// Cache element readers: f32 as is; f16 and bf16 widened in registers.
struct F32Elems {
  using T = float;
  static float get(const float* p, int64_t i) { return p[i]; }
};
struct F16Elems {
  using T = uint16_t;
  static float get(const uint16_t* p, int64_t i) { return f16_to_f32(p[i]); }
};
struct BF16Elems {
  using T = uint16_t;
  static float get(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
};

template <typename E>
void attend(const float* q, int64_t q_row_stride, int64_t q_heads, const AttentionBatch& batch,
            const TensorView& k_cache, const TensorView& v_cache, const AttentionParams& params,
            const float* slopes, const TensorView& out, const GqaLayout& gqa) {
  using T = typename E::T;
  const int64_t block_size = k_cache.dim(1), kv_heads = k_cache.dim(2), head_dim = k_cache.dim(3);
  const int64_t kv_row = kv_heads * head_dim;  // elements per cache slot
  const T* kc = k_cache.as<T>();
  const T* vc = v_cache.as<T>();
  const int64_t total_tokens = out.dim(0);

  // One work item per (token, head): flat, so short and long sequences balance across threads.
  struct Item {
    int32_t seq;
    int32_t token;  // row in q/out
  };
  std::vector<Item> items;
  items.reserve(total_tokens);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    for (int32_t t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) items.push_back({s, t});
  }
  const int64_t n_work = static_cast<int64_t>(items.size()) * q_heads;

#pragma omp parallel if (n_work > 1)
  {
    std::vector<float> scores;
    std::vector<float> acc(head_dim);
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < n_work; ++w) {
      const Item item = items[w / q_heads];
      const int64_t h = w % q_heads;
      const int64_t g = (gqa.q_head_offset + h) / gqa.group - gqa.kv_head_offset;
      const int s = item.seq;
      const int32_t n_new = batch.query_start[s + 1] - batch.query_start[s];
      const int32_t pos = batch.context_lens[s] - n_new + (item.token - batch.query_start[s]);
      // Keys first .. pos; blocks before `first` may already be freed.
      const int32_t first = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
      const int32_t n_keys = pos + 1 - first;
      const int32_t* table = batch.block_tables.data() + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
      const float* qv = q + item.token * q_row_stride + h * head_dim;

      scores.resize(n_keys);
      float mx = -INFINITY;
      for (int32_t i = 0; i < n_keys; ++i) {
        const int32_t j = first + i;
        const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
        const T* kv = kc + slot * kv_row + g * head_dim;
        float dot = 0;
        // simd reduction: lets the compiler reorder this sum into vector lanes.
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < head_dim; ++d) dot += qv[d] * E::get(kv, d);
        float sc = dot * params.scale;
        if (params.softcap > 0) sc = params.softcap * std::tanh(sc / params.softcap);
        if (slopes) sc += slopes[h] * static_cast<float>(j);
        scores[i] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0;
      for (int32_t j = 0; j < n_keys; ++j) sum += scores[j] = std::exp(scores[j] - mx);
      const float inv = 1.0f / sum;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t i = 0; i < n_keys; ++i) {
        const int32_t j = first + i;
        const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
        const T* vv = vc + slot * kv_row + g * head_dim;
        const float p = scores[i] * inv;
        float* a = acc.data();
#pragma omp simd
        for (int64_t d = 0; d < head_dim; ++d) a[d] += p * E::get(vv, d);
      }
      std::copy(acc.begin(), acc.end(), out.as<float>() + item.token * out.dim(1) + h * head_dim);
    }
  }
}

}  // namespace

void CpuBackend::attention_impl(const float* q, int64_t q_row_stride, int64_t q_heads,
                                const AttentionBatch& batch, const TensorView& k_cache,
                                const TensorView& v_cache, const AttentionParams& params,
                                const TensorView& out, const GqaLayout& gqa) {
  const float* slopes = params.alibi_slopes.empty() ? nullptr : params.alibi_slopes.as<float>();
  switch (k_cache.dtype) {
    case DType::kF32: return attend<F32Elems>(q, q_row_stride, q_heads, batch, k_cache, v_cache, params, slopes, out, gqa);
    case DType::kF16: return attend<F16Elems>(q, q_row_stride, q_heads, batch, k_cache, v_cache, params, slopes, out, gqa);
    case DType::kBF16: return attend<BF16Elems>(q, q_row_stride, q_heads, batch, k_cache, v_cache, params, slopes, out, gqa);
    default: TESSERA_CHECK(false) << "KV cache dtype " << dtype_name(k_cache.dtype);
  }
}

}  // namespace tessera
