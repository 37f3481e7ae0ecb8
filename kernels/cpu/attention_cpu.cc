// Paged causal attention on the CPU. Every new token of every sequence attends to the keys
// at positions 0..its own position (the last `window` of them with a sliding window), read
// through the sequence's block table; with ALiBi the score of key j gets slope_h * j added
// (BLOOM's bias; softmax is shift-invariant, so this equals the slope * (j - i) form).
// Two kernels (attention_cpu.h): the tiled online-softmax one the backend runs by default,
// and the plain reference it is tested against.
#include "kernels/cpu/attention_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera {
namespace cpu::detail {
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

// A decode-shaped tile (the key-rows form for every KV head) over more keys than this is cut
// into chunks of this many keys, at multiples of it from key 0 (so a sequence's chunks depend
// on its own positions only, never on its batch), each chunk one work item over all the KV
// heads: a row of the cache (every head's keys of one position) is then read in one pass, and
// one long sequence's attention spreads over the threads. The chunks' partial softmax sums are
// merged in chunk order. ~1.1B q4_0 decode at 1,800 keys of context, 2 threads: ~40% of the
// step was attention, a third of it widening one head's slice of each cached row at a time.
inline constexpr int32_t kSplitKeys = 512;

template <typename E>
void attend_tiled(const AttentionTileOps& ops, const float* q, int64_t q_row_stride, int64_t q_heads,
                  const AttentionBatch& batch, const TensorView& k_cache, const TensorView& v_cache,
                  const AttentionParams& params, const float* slopes, const TensorView& out, const GqaLayout& gqa) {
  using T = typename E::T;
  const int64_t block_size = k_cache.dim(1), kv_heads = k_cache.dim(2), head_dim = k_cache.dim(3);
  const int64_t kv_row = kv_heads * head_dim;
  const T* kc = k_cache.as<T>();
  const T* vc = v_cache.as<T>();
  // The local query heads that read each local KV head.
  std::vector<std::vector<int32_t>> heads_of(kv_heads);
  size_t most_heads = 0;
  for (int64_t h = 0; h < q_heads; ++h) {
    auto& heads = heads_of[(gqa.q_head_offset + h) / gqa.group - gqa.kv_head_offset];
    heads.push_back(static_cast<int32_t>(h));
    most_heads = std::max(most_heads, heads.size());
  }
  auto first_key = [&](int32_t pos) { return params.window > 0 ? std::max(0, pos - params.window + 1) : 0; };
  // A tile's first query position; its rows see keys [first_key(pos0), pos0 + nq - 1].
  auto first_pos = [&](int32_t seq, int32_t t0) {
    const int32_t n_new = batch.query_start[seq + 1] - batch.query_start[seq];
    return batch.context_lens[seq] - n_new + (t0 - batch.query_start[seq]);
  };
  // g < 0: a chunk [c0, c1) of a split tile over every KV head, its partial state at `partial`.
  struct Item {
    int32_t seq, t0, nq, g, c0 = 0, c1 = 0;
    int64_t partial = 0;
  };
  struct SplitTile {
    int32_t seq, t0, nq;
    int64_t first, count;  // its chunks' items
  };
  std::vector<Item> items;
  std::vector<SplitTile> split_tiles;
  const int64_t state_floats = head_dim + 2;  // a row's partial: max, sum, acc
  int64_t partial_floats = 0;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    // Later tiles attend to more keys: queue them first so the dynamic schedule ends even.
    const int32_t begin = batch.query_start[s], end = batch.query_start[s + 1];
    for (int32_t t1 = end; t1 > begin; t1 -= kQueryTile) {
      const int32_t t0 = std::max(begin, t1 - kQueryTile), nq = t1 - t0;
      const int32_t pos0 = first_pos(s, t0), lo = first_key(pos0), hi = pos0 + nq - 1;
      if (static_cast<int64_t>(most_heads) * nq <= kKeyRowsMaxRows && hi + 1 - lo > kSplitKeys) {
        const int64_t first = static_cast<int64_t>(items.size());
        for (int32_t c0 = lo; c0 <= hi; c0 = (c0 / kSplitKeys + 1) * kSplitKeys) {
          items.push_back({s, t0, nq, -1, c0, std::min(hi + 1, (c0 / kSplitKeys + 1) * kSplitKeys), partial_floats});
          partial_floats += nq * q_heads * state_floats;
        }
        split_tiles.push_back({s, t0, nq, first, static_cast<int64_t>(items.size()) - first});
        continue;
      }
      for (int32_t g = 0; g < kv_heads; ++g) {
        if (!heads_of[g].empty()) items.push_back({s, t0, nq, g});
      }
    }
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  const bool plain_scores = params.softcap <= 0 && slopes == nullptr;  // scores only scaled
  float* out_base = out.as<float>();
  const int64_t out_stride = out.dim(1);
  std::vector<float> partials(static_cast<size_t>(partial_floats));

#pragma omp parallel if (n_items > 1)
  {
    std::vector<float> kt, vb, s(kKeyBlock);
    std::vector<float> row_max, row_sum, acc;
    const void* k_rows[kKeyBlock];
    const void* v_rows[kKeyBlock];
    // Row r (query i of the tile, head h) over keys [j0, j0 + n) of one block, K widened in kb
    // (as rows or transposed) and V in vbk: the online softmax's running max, sum and values.
    auto update_row = [&](int64_t r, const Item& it, int32_t i, int32_t h, int32_t j0, int32_t n, bool key_rows,
                          const float* kb, const float* vbk) {
      const int32_t pos = first_pos(it.seq, it.t0) + i;
      // This row's keys within the block: [a, b).
      const int32_t a = std::max(first_key(pos), j0) - j0, b = std::min(pos, j0 + n - 1) - j0 + 1;
      if (b <= a) return;
      (key_rows ? ops.scores_rows : ops.scores)(q + static_cast<int64_t>(it.t0 + i) * q_row_stride + h * head_dim, kb,
                                                head_dim, n, s.data());
      float mx = -INFINITY;
      if (a == 0 && b == n && plain_scores) {
        // Every key of the block visible and plain scores (decode; prefill tiles below the
        // diagonal): a loop the compiler vectorizes.
        float* sc = s.data();
        const float scale = params.scale;
#pragma omp simd reduction(max : mx)
        for (int32_t jj = 0; jj < n; ++jj) {
          sc[jj] *= scale;
          mx = std::max(mx, sc[jj]);
        }
      } else {
        for (int32_t jj = 0; jj < n; ++jj) {
          if (jj < a || jj >= b) {
            s[jj] = -INFINITY;
            continue;
          }
          float sc = s[jj] * params.scale;
          if (params.softcap > 0) sc = params.softcap * std::tanh(sc / params.softcap);
          if (slopes) sc += slopes[h] * static_cast<float>(j0 + jj);
          s[jj] = sc;
          mx = std::max(mx, sc);
        }
      }
      const float new_max = std::max(row_max[r], mx);
      const float rescale = std::exp(row_max[r] - new_max);  // 0 on the first block
      const float sum = ops.exp_shifted(s.data(), n, new_max);
      row_sum[r] = row_sum[r] * rescale + sum;
      ops.accumulate(s.data(), vbk, n, head_dim, rescale, acc.data() + r * head_dim);
      row_max[r] = new_max;
    };
    auto block_rows = [&](const Item& it, int32_t j0, int32_t n, int64_t g) {
      const int32_t* table = batch.block_tables.data() + static_cast<int64_t>(it.seq) * batch.max_blocks_per_seq;
      for (int32_t i = 0; i < n; ++i) {
        const int32_t j = j0 + i;
        const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
        k_rows[i] = kc + slot * kv_row + g * head_dim;
        v_rows[i] = vc + slot * kv_row + g * head_dim;
      }
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_items; ++w) {
      const Item it = items[w];
      if (it.g < 0) {
        // A chunk of a split tile: rows g-major (heads_of[g]'s heads, then the tile's queries).
        const int64_t rows = static_cast<int64_t>(it.nq) * q_heads, group_stride = kKeyBlock * head_dim;
        row_max.assign(rows, -INFINITY);
        row_sum.assign(rows, 0.0f);
        acc.assign(rows * head_dim, 0.0f);
        kt.resize(kv_heads * group_stride);
        vb.resize(kv_heads * group_stride);
        for (int32_t j0 = it.c0; j0 < it.c1; j0 += static_cast<int32_t>(kKeyBlock)) {
          const int32_t n = std::min<int32_t>(static_cast<int32_t>(kKeyBlock), it.c1 - j0);
          block_rows(it, j0, n, 0);
          ops.gather_rows(k_rows, v_rows, k_cache.dtype, head_dim, n, kv_heads, group_stride, kt.data(), vb.data());
          int64_t r = 0;
          for (int64_t g = 0; g < kv_heads; ++g) {
            const std::vector<int32_t>& heads = heads_of[g];
            const int64_t nh = static_cast<int64_t>(heads.size());
            for (int64_t k = 0; k < it.nq * nh; ++k, ++r) {
              update_row(r, it, static_cast<int32_t>(k / nh), heads[k % nh], j0, n, true,
                         kt.data() + g * group_stride, vb.data() + g * group_stride);
            }
          }
        }
        float* part = partials.data() + it.partial;
        for (int64_t r = 0; r < rows; ++r, part += state_floats) {
          part[0] = row_max[r];
          part[1] = row_sum[r];
          std::copy(acc.begin() + r * head_dim, acc.begin() + (r + 1) * head_dim, part + 2);
        }
        continue;
      }
      const std::vector<int32_t>& heads = heads_of[it.g];
      const int64_t nh = static_cast<int64_t>(heads.size()), rows = it.nq * nh;
      const bool key_rows = rows <= kKeyRowsMaxRows;  // kt then holds the keys as rows
      row_max.assign(rows, -INFINITY);
      row_sum.assign(rows, 0.0f);
      acc.assign(rows * head_dim, 0.0f);
      kt.resize(head_dim * kKeyBlock);
      vb.resize(kKeyBlock * head_dim);
      const int32_t pos0 = first_pos(it.seq, it.t0);
      const int32_t lo = first_key(pos0), hi = pos0 + it.nq - 1;  // keys any row of the tile sees
      for (int32_t j0 = lo; j0 <= hi; j0 += static_cast<int32_t>(kKeyBlock)) {
        const int32_t n = std::min<int32_t>(static_cast<int32_t>(kKeyBlock), hi + 1 - j0);
        block_rows(it, j0, n, it.g);
        if (key_rows) {
          ops.gather_rows(k_rows, v_rows, k_cache.dtype, head_dim, n, 1, 0, kt.data(), vb.data());
        } else {
          ops.gather(k_rows, v_rows, k_cache.dtype, head_dim, n, kt.data(), vb.data());
        }
        for (int64_t r = 0; r < rows; ++r) {
          update_row(r, it, static_cast<int32_t>(r / nh), heads[r % nh], j0, n, key_rows, kt.data(), vb.data());
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int32_t i = static_cast<int32_t>(r / nh);
        const int32_t h = heads[r % nh];
        const float inv = 1.0f / row_sum[r];
        float* o = out_base + static_cast<int64_t>(it.t0 + i) * out_stride + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = acc[r * head_dim + d] * inv;
      }
    }
    // The split tiles' chunks merged, in chunk order: each rescaled to the largest max.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < static_cast<int64_t>(split_tiles.size()); ++t) {
      const SplitTile& tile = split_tiles[t];
      std::vector<float> merged(head_dim);
      int64_t r = 0;
      for (int64_t g = 0; g < kv_heads; ++g) {
        const std::vector<int32_t>& heads = heads_of[g];
        const int64_t nh = static_cast<int64_t>(heads.size());
        for (int64_t k = 0; k < tile.nq * nh; ++k, ++r) {
          float top = -INFINITY;
          for (int64_t c = 0; c < tile.count; ++c) {
            top = std::max(top, partials[items[tile.first + c].partial + r * state_floats]);
          }
          float sum = 0.0f;
          std::fill(merged.begin(), merged.end(), 0.0f);
          for (int64_t c = 0; c < tile.count; ++c) {
            const float* part = partials.data() + items[tile.first + c].partial + r * state_floats;
            if (part[0] == -INFINITY) continue;  // no key of this chunk in the row's view
            const float w = std::exp(part[0] - top);
            sum += part[1] * w;
            for (int64_t d = 0; d < head_dim; ++d) merged[d] += part[2 + d] * w;
          }
          const float inv = 1.0f / sum;
          float* o = out_base + static_cast<int64_t>(tile.t0 + k / nh) * out_stride + heads[k % nh] * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) o[d] = merged[d] * inv;
        }
      }
    }
  }
}

float widen_element(const void* row, DType dtype, int64_t d) {
  switch (dtype) {
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(row)[d]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(row)[d]);
    default: return static_cast<const float*>(row)[d];
  }
}

void gather_scalar(const void* const* k_rows, const void* const* v_rows, DType dtype, int64_t head_dim, int32_t n,
                   float* kt, float* vb) {
  for (int32_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < head_dim; ++d) kt[d * kKeyBlock + i] = widen_element(k_rows[i], dtype, d);
    for (int64_t d = 0; d < head_dim; ++d) vb[i * head_dim + d] = widen_element(v_rows[i], dtype, d);
  }
  const int32_t padded = (n + 7) / 8 * 8;
  for (int64_t d = 0; d < head_dim; ++d) {
    for (int32_t i = n; i < padded; ++i) kt[d * kKeyBlock + i] = 0.0f;
  }
}

void scores_scalar(const float* q, const float* kt, int64_t head_dim, int64_t n, float* s) {
  for (int64_t j = 0; j < n; ++j) s[j] = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) {
    const float qd = q[d];
    const float* row = kt + d * kKeyBlock;
    for (int64_t j = 0; j < n; ++j) s[j] += qd * row[j];
  }
}

float exp_shifted_scalar(float* s, int64_t n, float max) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += s[j] = std::exp(s[j] - max);
  return sum;
}

void accumulate_scalar(const float* p, const float* v, int64_t n, int64_t head_dim, float rescale, float* acc) {
  for (int64_t d = 0; d < head_dim; ++d) acc[d] *= rescale;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += p[j] * v[j * head_dim + d];
  }
}

void gather_rows_scalar(const void* const* k_rows, const void* const* v_rows, DType dtype, int64_t head_dim, int32_t n,
                        int64_t groups, int64_t group_stride, float* kr, float* vb) {
  for (int32_t i = 0; i < n; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t d = 0; d < head_dim; ++d) {
        kr[g * group_stride + i * head_dim + d] = widen_element(k_rows[i], dtype, g * head_dim + d);
        vb[g * group_stride + i * head_dim + d] = widen_element(v_rows[i], dtype, g * head_dim + d);
      }
    }
  }
}

void scores_rows_scalar(const float* q, const float* kr, int64_t head_dim, int64_t n, float* s) {
  for (int64_t j = 0; j < n; ++j) {
    float dot = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * kr[j * head_dim + d];
    s[j] = dot;
  }
}

}  // namespace

AttentionTileOps attention_tile_ops_scalar() {
  return {gather_scalar, scores_scalar, exp_shifted_scalar, accumulate_scalar, gather_rows_scalar, scores_rows_scalar};
}

AttentionTileOps attention_tile_ops_for(CpuIsa isa) {
  if (isa >= CpuIsa::kAvx512) return attention_tile_ops_avx512();
  return isa >= CpuIsa::kAvx2 ? attention_tile_ops_avx2() : attention_tile_ops_scalar();
}

#define TESSERA_ATTENTION_DTYPES(KERNEL, ...)                                                  \
  switch (k_cache.dtype) {                                                                      \
    case DType::kF32: return KERNEL<F32Elems>(__VA_ARGS__);                                     \
    case DType::kF16: return KERNEL<F16Elems>(__VA_ARGS__);                                     \
    case DType::kBF16: return KERNEL<BF16Elems>(__VA_ARGS__);                                   \
    default: TESSERA_CHECK(false) << "KV cache dtype " << dtype_name(k_cache.dtype);            \
  }

void attention_reference(const float* q, int64_t q_row_stride, int64_t q_heads, const AttentionBatch& batch,
                         const TensorView& k_cache, const TensorView& v_cache, const AttentionParams& params,
                         const TensorView& out, const GqaLayout& gqa) {
  const float* slopes = params.alibi_slopes.empty() ? nullptr : params.alibi_slopes.as<float>();
  TESSERA_ATTENTION_DTYPES(attend, q, q_row_stride, q_heads, batch, k_cache, v_cache, params, slopes, out, gqa)
}

void attention_tiled(const AttentionTileOps& ops, const float* q, int64_t q_row_stride, int64_t q_heads,
                     const AttentionBatch& batch, const TensorView& k_cache, const TensorView& v_cache,
                     const AttentionParams& params, const TensorView& out, const GqaLayout& gqa) {
  const float* slopes = params.alibi_slopes.empty() ? nullptr : params.alibi_slopes.as<float>();
  TESSERA_ATTENTION_DTYPES(attend_tiled, ops, q, q_row_stride, q_heads, batch, k_cache, v_cache, params, slopes, out,
                           gqa)
}

#undef TESSERA_ATTENTION_DTYPES

}  // namespace cpu::detail

void CpuBackend::attention_impl(const TensorView& q_v, const AttentionBatch& batch, const TensorView& k_cache,
                                const TensorView& v_cache, const AttentionParams& params,
                                const TensorView& out, const GqaLayout& gqa) {
  const float* q = q_v.as<float>();
  const int64_t q_row_stride = q_v.row_stride(), q_heads = q_v.dim(1);
  if (options_.attention == cpu::AttentionKernel::kReference) {
    cpu::detail::attention_reference(q, q_row_stride, q_heads, batch, k_cache, v_cache, params, out, gqa);
    return;
  }
  const cpu::detail::AttentionTileOps ops = cpu::detail::attention_tile_ops_for(cpu::usable_cpu_isa(options_.isa));
  cpu::detail::attention_tiled(ops, q, q_row_stride, q_heads, batch, k_cache, v_cache, params, out, gqa);
}

}  // namespace tessera
