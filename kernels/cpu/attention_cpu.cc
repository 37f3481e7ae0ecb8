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

// One call of the tiled kernel: the work items planned over the batch, run on the OpenMP
// threads, and the split tiles' chunks merged.
template <typename E>
class TiledAttention {
 public:
  using T = typename E::T;
  TiledAttention(const AttentionTileOps& ops, const float* q, int64_t q_row_stride, int64_t q_heads,
                 const AttentionBatch& batch, const TensorView& k_cache, const TensorView& v_cache,
                 const AttentionParams& params, const float* slopes, const TensorView& out, const GqaLayout& gqa)
      : ops_(ops), q_(q), q_row_stride_(q_row_stride), q_heads_(q_heads), batch_(batch), params_(params),
        slopes_(slopes), block_size_(k_cache.dim(1)), kv_heads_(k_cache.dim(2)), head_dim_(k_cache.dim(3)),
        kv_row_(kv_heads_ * head_dim_), cache_dtype_(k_cache.dtype), kc_(k_cache.as<T>()), vc_(v_cache.as<T>()),
        out_(out.as<float>()), out_stride_(out.dim(1)), heads_of_(kv_heads_),
        plain_scores_(params.softcap <= 0 && slopes == nullptr) {
    // The local query heads that read each local KV head.
    for (int64_t h = 0; h < q_heads; ++h) {
      heads_of_[(gqa.q_head_offset + h) / gqa.group - gqa.kv_head_offset].push_back(static_cast<int32_t>(h));
    }
    plan();
  }

  void run() {
    const int64_t n_items = static_cast<int64_t>(items_.size());
#pragma omp parallel if (n_items > 1)
    {
      Scratch scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t w = 0; w < n_items; ++w) {
        if (items_[w].g < 0) {
          run_chunk(scratch, items_[w]);
        } else {
          run_tile(scratch, items_[w]);
        }
      }
#pragma omp for schedule(static)
      for (int64_t t = 0; t < static_cast<int64_t>(split_tiles_.size()); ++t) merge(split_tiles_[t]);
    }
  }

 private:
  // g >= 0: a tile of nq queries from t0 over every key for the query heads of KV head g.
  // g < 0: keys [c0, c1) of a split tile for every KV head, its partial state at `partial`.
  struct Item {
    int32_t seq, t0, nq, g, c0 = 0, c1 = 0;
    int64_t partial = 0;
  };
  struct SplitTile {
    int32_t seq, t0, nq;
    int64_t first, count;  // its chunks' items
  };
  // A thread's buffers: a key block widened (K as rows or transposed, V as rows), the scores,
  // the rows' running softmax state, and the block's cache rows.
  struct Scratch {
    std::vector<float> kt, vb, s = std::vector<float>(kKeyBlock), row_max, row_sum, acc;
    const void* k_rows[kKeyBlock];
    const void* v_rows[kKeyBlock];
    void reset(int64_t rows, int64_t head_dim) {
      row_max.assign(rows, -INFINITY);
      row_sum.assign(rows, 0.0f);
      acc.assign(rows * head_dim, 0.0f);
    }
  };
  static constexpr int64_t kStateFloats = 2;  // a row's partial: max, sum, then acc

  int32_t first_key(int32_t pos) const { return params_.window > 0 ? std::max(0, pos - params_.window + 1) : 0; }
  // A tile's first query position; its rows see keys [first_key(pos0), pos0 + nq - 1].
  int32_t first_pos(int32_t seq, int32_t t0) const {
    const int32_t n_new = batch_.query_start[seq + 1] - batch_.query_start[seq];
    return batch_.context_lens[seq] - n_new + (t0 - batch_.query_start[seq]);
  }

  void plan() {
    size_t most_heads = 0;
    for (const auto& heads : heads_of_) most_heads = std::max(most_heads, heads.size());
    int64_t partial_floats = 0;
    for (int s = 0; s < batch_.num_seqs(); ++s) {
      // Later tiles attend to more keys: queue them first so the dynamic schedule ends even.
      const int32_t begin = batch_.query_start[s], end = batch_.query_start[s + 1];
      for (int32_t t1 = end; t1 > begin; t1 -= kQueryTile) {
        const int32_t t0 = std::max(begin, t1 - kQueryTile), nq = t1 - t0;
        const int32_t pos0 = first_pos(s, t0), lo = first_key(pos0), hi = pos0 + nq - 1;
        if (static_cast<int64_t>(most_heads) * nq <= kKeyRowsMaxRows && hi + 1 - lo > kSplitKeys) {
          const int64_t first = static_cast<int64_t>(items_.size());
          for (int32_t c0 = lo; c0 <= hi; c0 = (c0 / kSplitKeys + 1) * kSplitKeys) {
            items_.push_back({s, t0, nq, -1, c0, std::min(hi + 1, (c0 / kSplitKeys + 1) * kSplitKeys), partial_floats});
            partial_floats += nq * q_heads_ * (kStateFloats + head_dim_);
          }
          split_tiles_.push_back({s, t0, nq, first, static_cast<int64_t>(items_.size()) - first});
          continue;
        }
        for (int32_t g = 0; g < kv_heads_; ++g) {
          if (!heads_of_[g].empty()) items_.push_back({s, t0, nq, g});
        }
      }
    }
    partials_.resize(static_cast<size_t>(partial_floats));
  }

  // The cache rows of keys [j0, j0 + n) of the item's sequence, from KV head g on.
  void block_rows(Scratch& sc, const Item& it, int32_t j0, int32_t n, int64_t g) const {
    const int32_t* table = batch_.block_tables.data() + static_cast<int64_t>(it.seq) * batch_.max_blocks_per_seq;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t j = j0 + i;
      const int64_t slot = static_cast<int64_t>(table[j / block_size_]) * block_size_ + j % block_size_;
      sc.k_rows[i] = kc_ + slot * kv_row_ + g * head_dim_;
      sc.v_rows[i] = vc_ + slot * kv_row_ + g * head_dim_;
    }
  }

  // State row r (query i of the tile, head h) over keys [j0, j0 + n) of one block, K widened
  // in kb (as rows or transposed) and V in vb: the online softmax's running max, sum and values.
  void update_row(Scratch& sc, int64_t r, const Item& it, int32_t i, int32_t h, int32_t j0, int32_t n, bool key_rows,
                  const float* kb, const float* vb) const {
    const int32_t pos = first_pos(it.seq, it.t0) + i;
    // This row's keys within the block: [a, b).
    const int32_t a = std::max(first_key(pos), j0) - j0, b = std::min(pos, j0 + n - 1) - j0 + 1;
    if (b <= a) return;
    (key_rows ? ops_.scores_rows : ops_.scores)(q_ + static_cast<int64_t>(it.t0 + i) * q_row_stride_ + h * head_dim_,
                                                kb, head_dim_, n, sc.s.data());
    float mx = -INFINITY;
    if (a == 0 && b == n && plain_scores_) {
      // Every key of the block visible and plain scores (decode; prefill tiles below the
      // diagonal): a loop the compiler vectorizes.
      float* s = sc.s.data();
      const float scale = params_.scale;
#pragma omp simd reduction(max : mx)
      for (int32_t jj = 0; jj < n; ++jj) {
        s[jj] *= scale;
        mx = std::max(mx, s[jj]);
      }
    } else {
      for (int32_t jj = 0; jj < n; ++jj) {
        if (jj < a || jj >= b) {
          sc.s[jj] = -INFINITY;
          continue;
        }
        float v = sc.s[jj] * params_.scale;
        if (params_.softcap > 0) v = params_.softcap * std::tanh(v / params_.softcap);
        if (slopes_) v += slopes_[h] * static_cast<float>(j0 + jj);
        sc.s[jj] = v;
        mx = std::max(mx, v);
      }
    }
    const float new_max = std::max(sc.row_max[r], mx);
    const float rescale = std::exp(sc.row_max[r] - new_max);  // 0 on the first block
    const float sum = ops_.exp_shifted(sc.s.data(), n, new_max);
    sc.row_sum[r] = sc.row_sum[r] * rescale + sum;
    ops_.accumulate(sc.s.data(), vb, n, head_dim_, rescale, sc.acc.data() + r * head_dim_);
    sc.row_max[r] = new_max;
  }

  // A tile for one KV head over all its keys, written to out.
  void run_tile(Scratch& sc, const Item& it) const {
    const std::vector<int32_t>& heads = heads_of_[it.g];
    const int64_t nh = static_cast<int64_t>(heads.size()), rows = it.nq * nh;
    const bool key_rows = rows <= kKeyRowsMaxRows;  // kt then holds the keys as rows
    sc.reset(rows, head_dim_);
    sc.kt.resize(head_dim_ * kKeyBlock);
    sc.vb.resize(kKeyBlock * head_dim_);
    const int32_t pos0 = first_pos(it.seq, it.t0);
    const int32_t lo = first_key(pos0), hi = pos0 + it.nq - 1;  // keys any row of the tile sees
    for (int32_t j0 = lo; j0 <= hi; j0 += static_cast<int32_t>(kKeyBlock)) {
      const int32_t n = std::min<int32_t>(static_cast<int32_t>(kKeyBlock), hi + 1 - j0);
      block_rows(sc, it, j0, n, it.g);
      if (key_rows) {
        ops_.gather_rows(sc.k_rows, sc.v_rows, cache_dtype_, head_dim_, n, 1, 0, sc.kt.data(), sc.vb.data());
      } else {
        ops_.gather(sc.k_rows, sc.v_rows, cache_dtype_, head_dim_, n, sc.kt.data(), sc.vb.data());
      }
      for (int64_t r = 0; r < rows; ++r) {
        update_row(sc, r, it, static_cast<int32_t>(r / nh), heads[r % nh], j0, n, key_rows, sc.kt.data(),
                   sc.vb.data());
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / sc.row_sum[r];
      float* o = out_ + static_cast<int64_t>(it.t0 + r / nh) * out_stride_ + heads[r % nh] * head_dim_;
      for (int64_t d = 0; d < head_dim_; ++d) o[d] = sc.acc[r * head_dim_ + d] * inv;
    }
  }

  // A chunk of a split tile over every KV head; state rows g-major (heads_of_[g]'s heads, then
  // the tile's queries), left in partials_.
  void run_chunk(Scratch& sc, const Item& it) {
    const int64_t rows = static_cast<int64_t>(it.nq) * q_heads_, group_stride = kKeyBlock * head_dim_;
    sc.reset(rows, head_dim_);
    sc.kt.resize(kv_heads_ * group_stride);
    sc.vb.resize(kv_heads_ * group_stride);
    for (int32_t j0 = it.c0; j0 < it.c1; j0 += static_cast<int32_t>(kKeyBlock)) {
      const int32_t n = std::min<int32_t>(static_cast<int32_t>(kKeyBlock), it.c1 - j0);
      block_rows(sc, it, j0, n, 0);
      ops_.gather_rows(sc.k_rows, sc.v_rows, cache_dtype_, head_dim_, n, kv_heads_, group_stride, sc.kt.data(),
                       sc.vb.data());
      int64_t r = 0;
      for (int64_t g = 0; g < kv_heads_; ++g) {
        const std::vector<int32_t>& heads = heads_of_[g];
        const int64_t nh = static_cast<int64_t>(heads.size());
        for (int64_t k = 0; k < it.nq * nh; ++k, ++r) {
          update_row(sc, r, it, static_cast<int32_t>(k / nh), heads[k % nh], j0, n, true,
                     sc.kt.data() + g * group_stride, sc.vb.data() + g * group_stride);
        }
      }
    }
    float* part = partials_.data() + it.partial;
    for (int64_t r = 0; r < rows; ++r, part += kStateFloats + head_dim_) {
      part[0] = sc.row_max[r];
      part[1] = sc.row_sum[r];
      std::copy(sc.acc.begin() + r * head_dim_, sc.acc.begin() + (r + 1) * head_dim_, part + kStateFloats);
    }
  }

  // A split tile's chunks merged in chunk order, each rescaled to the rows' largest max.
  void merge(const SplitTile& tile) {
    std::vector<float> merged(static_cast<size_t>(head_dim_));
    const int64_t row_floats = kStateFloats + head_dim_;
    int64_t r = 0;
    for (int64_t g = 0; g < kv_heads_; ++g) {
      const std::vector<int32_t>& heads = heads_of_[g];
      const int64_t nh = static_cast<int64_t>(heads.size());
      for (int64_t k = 0; k < tile.nq * nh; ++k, ++r) {
        float top = -INFINITY;
        for (int64_t c = 0; c < tile.count; ++c) {
          top = std::max(top, partials_[items_[tile.first + c].partial + r * row_floats]);
        }
        float sum = 0.0f;
        std::fill(merged.begin(), merged.end(), 0.0f);
        for (int64_t c = 0; c < tile.count; ++c) {
          const float* part = partials_.data() + items_[tile.first + c].partial + r * row_floats;
          if (part[0] == -INFINITY) continue;  // no key of this chunk in the row's view
          const float w = std::exp(part[0] - top);
          sum += part[1] * w;
          for (int64_t d = 0; d < head_dim_; ++d) merged[d] += part[kStateFloats + d] * w;
        }
        const float inv = 1.0f / sum;
        float* o = out_ + static_cast<int64_t>(tile.t0 + k / nh) * out_stride_ + heads[k % nh] * head_dim_;
        for (int64_t d = 0; d < head_dim_; ++d) o[d] = merged[d] * inv;
      }
    }
  }

  const AttentionTileOps& ops_;
  const float* q_;
  const int64_t q_row_stride_, q_heads_;
  const AttentionBatch& batch_;
  const AttentionParams& params_;
  const float* slopes_;
  const int64_t block_size_, kv_heads_, head_dim_, kv_row_;
  const DType cache_dtype_;
  const T* kc_;
  const T* vc_;
  float* out_;
  const int64_t out_stride_;
  std::vector<std::vector<int32_t>> heads_of_;
  const bool plain_scores_;
  std::vector<Item> items_;
  std::vector<SplitTile> split_tiles_;
  std::vector<float> partials_;
};

template <typename E>
void attend_tiled(const AttentionTileOps& ops, const float* q, int64_t q_row_stride, int64_t q_heads,
                  const AttentionBatch& batch, const TensorView& k_cache, const TensorView& v_cache,
                  const AttentionParams& params, const float* slopes, const TensorView& out, const GqaLayout& gqa) {
  TiledAttention<E>(ops, q, q_row_stride, q_heads, batch, k_cache, v_cache, params, slopes, out, gqa).run();
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
