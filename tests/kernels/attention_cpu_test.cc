// The tiled online-softmax CPU attention (kernels/cpu/attention_cpu.h) against the plain
// two-pass reference, with every flavour of inner loops (scalar; AVX2 and AVX-512 where the CPU has them):
// ragged batches mixing prefill from empty, chunked prefill after a cached prefix, and
// decode rows deep into long contexts (spanning several key blocks and query tiles); every
// cache dtype; GQA with tensor-parallel head offsets; head sizes that are not multiples of
// 8; ALiBi, soft-capping, sliding windows over freed blocks (-1 table entries, NaN before
// the window). Tolerance: outputs are convex combinations of V rows (|v| <= 1), so an
// absolute 1e-5 covers the different rounding of the dot products (~1e-6 in a score),
// the rescaled partial sums and the vector exp.
#include "kernels/cpu/attention_cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu::detail {
namespace {

struct PagedBatch {
  AttentionBatch batch;
  int64_t tokens = 0;
  int64_t num_blocks = 0;
};

// (past, fresh) tokens per sequence; blocks assigned in a shuffled order.
PagedBatch make_paged_batch(const std::vector<std::pair<int, int>>& past_fresh, int block_size, std::mt19937& rng) {
  PagedBatch b;
  std::vector<int> need;
  int max_blocks = 0;
  for (auto [past, fresh] : past_fresh) {
    need.push_back((past + fresh + block_size - 1) / block_size);
    max_blocks = std::max(max_blocks, need.back());
  }
  b.num_blocks = std::accumulate(need.begin(), need.end(), 0) + 2;
  std::vector<int32_t> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.batch.max_blocks_per_seq = max_blocks + 1;
  b.batch.query_start.push_back(0);
  size_t next = 0;
  for (size_t s = 0; s < past_fresh.size(); ++s) {
    const auto [past, fresh] = past_fresh[s];
    std::vector<int32_t> table(b.batch.max_blocks_per_seq, -1);
    for (int i = 0; i < need[s]; ++i) table[i] = ids[next++];
    for (int p = past; p < past + fresh; ++p) b.batch.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
    b.batch.block_tables.insert(b.batch.block_tables.end(), table.begin(), table.end());
    b.batch.context_lens.push_back(past + fresh);
    b.batch.query_start.push_back(b.batch.query_start.back() + fresh);
  }
  b.tokens = b.batch.query_start.back();
  return b;
}

Tensor random_tensor(const std::vector<int64_t>& dims, DType dtype, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::zeros(dims, dtype);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (float& v : values) v = dist(rng);
  convert_elements(values.data(), DType::kF32, t.view().data, dtype, values.size());
  return t;
}

// Frees what a sliding window has left behind, as the scheduler may: whole blocks before
// each sequence's first visible key become -1, earlier slots of the first kept block NaN.
void free_outside_window(AttentionBatch& batch, int block_size, int32_t window, Tensor& kc, Tensor& vc) {
  const int64_t slot_width = kc.dim(2) * kc.dim(3);
  const size_t esize = dtype_size(kc.dtype());
  std::vector<char> nan_row(slot_width * esize);
  const std::vector<float> nans(slot_width, std::nanf(""));
  convert_elements(nans.data(), DType::kF32, nan_row.data(), kc.dtype(), slot_width);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t n_new = batch.query_start[s + 1] - batch.query_start[s];
    const int32_t first_key = std::max(0, batch.context_lens[s] - n_new - window + 1);
    int32_t* table = batch.block_tables.data() + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
    for (int b = 0; b < first_key / block_size; ++b) table[b] = -1;
    for (int32_t j = first_key / block_size * block_size; j < first_key; ++j) {
      const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
      std::memcpy(kc.data<char>() + slot * slot_width * esize, nan_row.data(), nan_row.size());
      std::memcpy(vc.data<char>() + slot * slot_width * esize, nan_row.data(), nan_row.size());
    }
  }
}

struct TiledCase {
  int64_t q_heads, kv_heads, head_dim;
  int block_size;
  DType cache;
  bool alibi;
  float softcap;
  int32_t window;
  GqaLayout gqa;  // group 0: q_heads / kv_heads
};

std::vector<std::pair<const char*, AttentionTileOps>> tile_flavours() {
  std::vector<std::pair<const char*, AttentionTileOps>> f = {{"scalar", attention_tile_ops_scalar()}};
  if (detected_cpu_isa() >= CpuIsa::kAvx2) f.push_back({"avx2", attention_tile_ops_avx2()});
  if (detected_cpu_isa() >= CpuIsa::kAvx512) f.push_back({"avx512", attention_tile_ops_avx512()});
  return f;
}

void check_tiled(const TiledCase& c, const std::vector<std::pair<int, int>>& past_fresh, std::mt19937& rng) {
  PagedBatch b = make_paged_batch(past_fresh, c.block_size, rng);
  const int64_t D = c.head_dim, q_stride = c.q_heads * D + 5;
  Tensor q = random_tensor({b.tokens, q_stride}, DType::kF32, rng, -2.0f, 2.0f);
  Tensor kc = random_tensor({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache, rng, -1.0f, 1.0f);
  Tensor vc = random_tensor({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache, rng, -1.0f, 1.0f);
  if (c.window > 0) free_outside_window(b.batch, c.block_size, c.window, kc, vc);
  Tensor slopes = Tensor::zeros({c.q_heads}, DType::kF32);
  for (int64_t h = 0; h < c.q_heads; ++h) slopes.data<float>()[h] = std::pow(2.0f, -static_cast<float>(h + 1));
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(D));
  params.softcap = c.softcap;
  params.window = c.window;
  if (c.alibi) params.alibi_slopes = slopes.view();
  GqaLayout gqa = c.gqa;
  if (gqa.group == 0) gqa.group = c.q_heads / c.kv_heads;
  Tensor ref = Tensor::zeros({b.tokens, c.q_heads * D}, DType::kF32);
  attention_reference(q.data<float>(), q_stride, c.q_heads, b.batch, kc.view(), vc.view(), params, ref.view(), gqa);
  for (const auto& [name, ops] : tile_flavours()) {
    Tensor out = Tensor::zeros({b.tokens, c.q_heads * D}, DType::kF32);
    attention_tiled(ops, q.data<float>(), q_stride, c.q_heads, b.batch, kc.view(), vc.view(), params, out.view(), gqa);
    std::ostringstream tag;
    tag << name << " q_heads=" << c.q_heads << " kv_heads=" << c.kv_heads << " head_dim=" << D
        << " block=" << c.block_size << " " << dtype_name(c.cache) << (c.alibi ? " alibi" : "")
        << " softcap=" << c.softcap << " window=" << c.window << " q offset " << c.gqa.q_head_offset;
    int bad = 0;
    for (int64_t i = 0; i < ref.numel() && bad < 5; ++i) {
      const float want = ref.data<float>()[i], got = out.data<float>()[i];
      if (!(std::fabs(got - want) <= 1e-5f)) {
        ADD_FAILURE() << tag.str() << ": element " << i << " tiled " << got << ", reference " << want;
        ++bad;
      }
    }
  }
}

// Prefill from empty over several query tiles and key blocks, a decode row deep in a
// context, a chunked prefill after a cached prefix, a first-token decode, a long decode.
const std::vector<std::pair<int, int>> kRaggedBatch = {{0, 70}, {36, 1}, {20, 37}, {0, 1}, {200, 1}};

TEST(AttentionCpuTiled, MatchesReferenceOnRaggedBatches) {
  std::mt19937 rng(21);
  const TiledCase cases[] = {
      {12, 4, 64, 16, DType::kF32, false, 0, 0, {}},
      {8, 2, 128, 16, DType::kF16, true, 0, 0, {}},
      {6, 1, 40, 5, DType::kBF16, false, 0, 0, {}},
      {4, 2, 17, 7, DType::kF32, true, 0, 0, {}},
      // Tensor-parallel rank: global 8 query / 4 KV heads; this rank has query heads 2..4,
      // which read global KV heads 1..2, cached here as local heads 0..1.
      {3, 2, 96, 16, DType::kF16, true, 0, 0, {2, 2, 1}},
      {5, 5, 33, 3, DType::kBF16, true, 0, 0, {}},
      {1, 1, 1, 4, DType::kF32, false, 0, 0, {}},
  };
  for (const TiledCase& c : cases) check_tiled(c, kRaggedBatch, rng);
}

TEST(AttentionCpuTiled, SlidingWindowAndSoftcapMatchReference) {
  std::mt19937 rng(22);
  const TiledCase cases[] = {
      {4, 2, 64, 16, DType::kF32, false, 30.0f, 24, {}},
      {8, 4, 80, 5, DType::kBF16, true, 0, 9, {}},
      {2, 1, 64, 16, DType::kF16, false, 50.0f, 100, {}},
  };
  for (const TiledCase& c : cases) check_tiled(c, kRaggedBatch, rng);
}

TEST(AttentionCpuTiled, LongPrefillOverManyBlocks) {
  std::mt19937 rng(23);
  check_tiled({12, 4, 64, 16, DType::kBF16, false, 0, 0, {}}, {{0, 300}}, rng);
  check_tiled({4, 4, 64, 16, DType::kF32, false, 0, 0, {}}, {{129, 130}, {63, 2}}, rng);
}

// Decode rows (and short verify tiles) over more keys than a split chunk (kSplitKeys): their
// attention is cut into key chunks over every KV head and merged; GQA, a tensor-parallel
// rank's heads, ALiBi, a window longer than a chunk and a soft-cap, beside rows that are not
// split (a short context, a tile of too many rows).
TEST(AttentionCpuTiled, LongDecodeRowsSplitOverKeyChunksMatchReference) {
  std::mt19937 rng(24);
  check_tiled({8, 2, 64, 16, DType::kBF16, false, 0, 0, {}}, {{1300, 1}, {700, 2}, {511, 1}, {1024, 1}, {30, 1}},
              rng);
  check_tiled({3, 2, 96, 16, DType::kF16, true, 0, 0, {2, 2, 1}}, {{900, 1}, {40, 1}, {600, 3}}, rng);
  check_tiled({4, 2, 64, 16, DType::kF32, false, 30.0f, 700, {}}, {{1500, 1}, {800, 2}, {100, 1}}, rng);
  check_tiled({4, 4, 40, 5, DType::kBF16, true, 0, 0, {}}, {{1030, 1}, {1029, 2}}, rng);
}

}  // namespace
}  // namespace tessera::cpu::detail
