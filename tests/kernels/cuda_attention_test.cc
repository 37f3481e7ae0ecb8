// Parity of the CUDA KV-cache writes and paged attention with the CPU backend: ragged
// batches mixing prefill chunks and decode rows, every cache dtype, GQA and tensor-parallel
// head offsets, ALiBi, soft-capping, sliding windows over partly freed block tables
// (tolerances: see cuda_backend_test.cc).
#include "tests/kernels/cuda_test_fixture.h"

namespace tessera {
namespace {

using namespace cuda_test;

struct Batch {
  AttentionBatch batch;
  int64_t tokens = 0;
  int64_t num_blocks = 0;
};

Batch make_batch(const std::vector<std::pair<int, int>>& past_fresh, int block_size, std::mt19937& rng) {
  Batch b;
  std::vector<int> need;
  int max_blocks = 0;
  for (auto [past, fresh] : past_fresh) {
    need.push_back((past + fresh + block_size - 1) / block_size);
    max_blocks = std::max(max_blocks, need.back());
  }
  b.num_blocks = std::accumulate(need.begin(), need.end(), 0) + 3;  // some blocks stay unused
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
    for (int p = past; p < past + fresh; ++p) {
      b.batch.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
    }
    b.batch.block_tables.insert(b.batch.block_tables.end(), table.begin(), table.end());
    b.batch.context_lens.push_back(past + fresh);
    b.batch.query_start.push_back(b.batch.query_start.back() + fresh);
  }
  b.tokens = b.batch.query_start.back();
  return b;
}

// Prefill from empty, a decode row deep into a context, a chunked prefill after a cached
// prefix, a first-token decode, a long decode crossing many blocks.
const std::vector<std::pair<int, int>> kMixedBatch = {{0, 7}, {36, 1}, {20, 5}, {0, 1}, {130, 1}};

TEST_F(CudaBackendTest, WriteKvScattersRowsToTheirSlotsInEveryCacheDtype) {
  for (DType ct : kFloatTypes) {
    for (int block_size : {5, 16}) {
      Batch b = make_batch(kMixedBatch, block_size, rng_);
      const int64_t kv_heads = 2, head_dim = 6, width = kv_heads * head_dim, stride = 3 * width + 4;
      Tensor kv = random_host({b.tokens, stride}, DType::kF32, -3.0f, 3.0f);
      Tensor kc = Tensor::zeros({b.num_blocks, block_size, kv_heads, head_dim}, ct);
      Tensor vc = Tensor::zeros({b.num_blocks, block_size, kv_heads, head_dim}, ct);
      // k and v as slices of a packed qkv row
      auto heads = [&](const Tensor& t, int64_t begin) {
        return t.view().columns(begin, width).reshape({b.tokens, kv_heads, head_dim});
      };
      cpu_->write_kv(heads(kv, width), heads(kv, 2 * width), b.batch, kc, vc);
      Tensor kv_d = to_device(kv);
      Tensor kc_d = cuda_->alloc(kc.view().dims(), ct), vc_d = cuda_->alloc(vc.view().dims(), ct);
      cuda_->write_kv(heads(kv_d, width), heads(kv_d, 2 * width), b.batch, kc_d, vc_d);
      const std::string tag = std::string(dtype_name(ct)) + " block " + std::to_string(block_size);
      expect_close(widen(kc), device_f32(kc_d), 0, 0, "k cache " + tag);
      expect_close(widen(vc), device_f32(vc_d), 0, 0, "v cache " + tag);
    }
  }
}

struct AttnCase {
  int64_t q_heads, kv_heads, head_dim;
  int block_size;
  DType cache;
  bool alibi;
  GqaLayout gqa;  // group 0: derived from the head counts
};

TEST_F(CudaBackendTest, PagedAttentionMatchesForPrefillAndDecodeRows) {
  const AttnCase cases[] = {
      {4, 4, 64, 16, DType::kF32, false, {}},
      {8, 2, 128, 16, DType::kF16, true, {}},
      {6, 1, 40, 5, DType::kBF16, false, {}},
      {4, 2, 80, 7, DType::kF32, true, {}},
      // Tensor-parallel rank: global 8 query / 4 KV heads; this rank has query heads 2..4,
      // which read global KV heads 1..2, cached here as local heads 0..1.
      {3, 2, 96, 16, DType::kF16, true, {2, 2, 1}},
      {2, 1, 256, 16, DType::kF16, false, {}},
      {5, 5, 33, 3, DType::kBF16, true, {}},
      {1, 1, 1, 4, DType::kF32, false, {}},
  };
  for (const AttnCase& c : cases) {
    Batch b = make_batch(kMixedBatch, c.block_size, rng_);
    const int64_t D = c.head_dim, q_stride = c.q_heads * D + 13;
    Tensor q = random_host({b.tokens, q_stride}, DType::kF32);
    Tensor kc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    Tensor vc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    const Tensor slopes = c.alibi ? alibi_test_slopes(c.q_heads) : Tensor();
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Tensor ref = Tensor::zeros({b.tokens, c.q_heads * D}, DType::kF32);
    auto q_heads = [&](const Tensor& t) {
      return t.view().columns(0, c.q_heads * D).reshape({b.tokens, c.q_heads, D});
    };
    cpu_->attention(q_heads(q), b.batch, kc, vc, {.scale = scale, .alibi_slopes = slopes}, ref, c.gqa);
    Tensor q_d = to_device(q), kc_d = to_device(kc), vc_d = to_device(vc);
    Tensor slopes_d = c.alibi ? to_device(slopes) : Tensor();
    Tensor out = cuda_->alloc({b.tokens, c.q_heads * D}, DType::kF32);
    cuda_->attention(q_heads(q_d), b.batch, kc_d, vc_d, {.scale = scale, .alibi_slopes = slopes_d}, out, c.gqa);
    std::ostringstream tag;
    tag << "attention q_heads=" << c.q_heads << " kv_heads=" << c.kv_heads << " head_dim=" << D << " block="
        << c.block_size << " " << dtype_name(c.cache) << (c.alibi ? " alibi" : "") << " gqa offset "
        << c.gqa.q_head_offset;
    expect_close(widen(ref), device_f32(out), 1e-5, 1e-5, tag.str());
  }
}

// What a scheduler may free once a sliding window has moved past it: for each sequence, the
// blocks wholly before the first key any of its new tokens reads get table entry -1, and
// the keys and values before that first key in the first kept block become NaN. A backend
// that read outside the window would fail its own block check on a -1 entry, fault, or put
// NaN in its output. Returns how many table entries were dropped.
int drop_outside_window(AttentionBatch& batch, int block_size, int32_t window, Tensor& kc, Tensor& vc) {
  const int64_t slot_width = kc.dim(2) * kc.dim(3);
  const size_t esize = dtype_size(kc.dtype());
  std::vector<char> nan_row(slot_width * esize);
  const std::vector<float> nans(slot_width, std::nanf(""));
  convert_elements(nans.data(), DType::kF32, nan_row.data(), kc.dtype(), slot_width);
  int dropped = 0;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int32_t n_new = batch.query_start[s + 1] - batch.query_start[s];
    const int32_t first_key = std::max(0, batch.context_lens[s] - n_new - window + 1);
    int32_t* table = batch.block_tables.data() + static_cast<int64_t>(s) * batch.max_blocks_per_seq;
    for (int b = 0; b < first_key / block_size; ++b) {
      table[b] = -1;
      ++dropped;
    }
    for (int32_t j = first_key / block_size * block_size; j < first_key; ++j) {
      const int64_t slot = static_cast<int64_t>(table[j / block_size]) * block_size + j % block_size;
      std::memcpy(kc.data<char>() + slot * slot_width * esize, nan_row.data(), nan_row.size());
      std::memcpy(vc.data<char>() + slot * slot_width * esize, nan_row.data(), nan_row.size());
    }
  }
  return dropped;
}

TEST_F(CudaBackendTest, PagedAttentionWithSlidingWindowAndSoftcapMatches) {
  struct Case {
    int64_t q_heads, kv_heads, head_dim;
    int block_size;
    DType cache;
    bool alibi;
    int32_t window;  // 0: none
    float softcap;   // 0: none
  };
  const Case cases[] = {
      // Sliding window only: one key, a few, Mistral's shape, with ALiBi, wider than every context.
      {4, 4, 64, 16, DType::kF32, false, 1, 0.0f},
      {6, 1, 40, 5, DType::kBF16, false, 7, 0.0f},
      {8, 2, 128, 16, DType::kF16, false, 16, 0.0f},
      {4, 2, 80, 7, DType::kF32, true, 30, 0.0f},
      {2, 1, 64, 4, DType::kF32, false, 1000, 0.0f},
      // Soft cap only: caps near the scores' size (of order 1 here, see q below), and Gemma 2's 50.
      {4, 4, 64, 16, DType::kF32, false, 0, 1.5f},
      {3, 3, 33, 3, DType::kF16, true, 0, 3.0f},
      {8, 4, 256, 16, DType::kBF16, false, 0, 50.0f},
      // Both, as Gemma 2's sliding layers use them.
      {8, 4, 256, 16, DType::kBF16, false, 16, 50.0f},
      {4, 2, 64, 5, DType::kF16, false, 9, 2.0f},
      {6, 2, 96, 7, DType::kF32, true, 3, 1.0f},
  };
  for (const Case& c : cases) {
    Batch b = make_batch(kMixedBatch, c.block_size, rng_);
    const int64_t D = c.head_dim, q_stride = c.q_heads * D + 3;
    // Wider q than the other attention tests (scores of standard deviation ~1 after the
    // scale), so that the small caps bend most scores.
    Tensor q = random_host({b.tokens, q_stride}, DType::kF32, -3.0f, 3.0f);
    Tensor kc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    Tensor vc = random_host({b.num_blocks, c.block_size, c.kv_heads, D}, c.cache);
    const int dropped = c.window > 0 ? drop_outside_window(b.batch, c.block_size, c.window, kc, vc) : 0;
    if (c.window > 0 && c.window < 100) {
      // The 130-token decode row of kMixedBatch always leaves whole blocks behind.
      EXPECT_GT(dropped, 0) << "window " << c.window << " dropped no block";
    }
    const Tensor slopes = c.alibi ? alibi_test_slopes(c.q_heads) : Tensor();
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    Tensor ref = Tensor::zeros({b.tokens, c.q_heads * D}, DType::kF32);
    auto q_heads = [&](const Tensor& t) {
      return t.view().columns(0, c.q_heads * D).reshape({b.tokens, c.q_heads, D});
    };
    cpu_->attention(q_heads(q), b.batch, kc, vc,
                    {.scale = scale, .softcap = c.softcap, .window = c.window, .alibi_slopes = slopes}, ref);
    Tensor q_d = to_device(q), kc_d = to_device(kc), vc_d = to_device(vc);
    Tensor slopes_d = c.alibi ? to_device(slopes) : Tensor();
    Tensor out = cuda_->alloc({b.tokens, c.q_heads * D}, DType::kF32);
    cuda_->attention(q_heads(q_d), b.batch, kc_d, vc_d,
                     {.scale = scale, .softcap = c.softcap, .window = c.window, .alibi_slopes = slopes_d}, out);
    std::ostringstream tag;
    tag << "attention window=" << c.window << " softcap=" << c.softcap << " q_heads=" << c.q_heads
        << " kv_heads=" << c.kv_heads << " head_dim=" << D << " block=" << c.block_size << " "
        << dtype_name(c.cache) << (c.alibi ? " alibi" : "") << " (" << dropped << " blocks dropped)";
    expect_close(widen(ref), device_f32(out), 1e-5, 1e-5, tag.str());
  }
}

TEST_F(CudaBackendTest, WriteThenAttendOverManySteps) {
  // Decode loop as the executor drives it: write this step's K/V, attend, repeat; the
  // caches and outputs of both backends must stay together.
  const int block_size = 4;
  const int64_t q_heads = 4, kv_heads = 2, D = 32, width = (q_heads + 2 * kv_heads) * D;
  for (DType ct : kFloatTypes) {
    Batch full = make_batch({{0, 12}, {0, 9}}, block_size, rng_);
    Tensor kc = Tensor::zeros({full.num_blocks, block_size, kv_heads, D}, ct), vc = host_copy(kc);
    Tensor kc_d = cuda_->alloc(kc.view().dims(), ct), vc_d = cuda_->alloc(vc.view().dims(), ct);
    // Step 1: prefill of the first 8 and 5 tokens; then 4 decode steps of one token each.
    std::vector<std::pair<int, int>> steps = {{8, 5}};
    for (int i = 0; i < 4; ++i) steps.push_back({8 + i, 5 + i});
    for (size_t step = 0; step < steps.size(); ++step) {
      AttentionBatch ab;
      ab.max_blocks_per_seq = full.batch.max_blocks_per_seq;
      ab.block_tables = full.batch.block_tables;
      ab.query_start.push_back(0);
      for (int s = 0; s < 2; ++s) {
        const int past = step == 0 ? 0 : (s == 0 ? steps[step].first : steps[step].second);
        const int fresh = step == 0 ? (s == 0 ? steps[0].first : steps[0].second) : 1;
        const int32_t* table = full.batch.block_tables.data() + s * ab.max_blocks_per_seq;
        for (int p = past; p < past + fresh; ++p) {
          ab.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
        }
        ab.context_lens.push_back(past + fresh);
        ab.query_start.push_back(ab.query_start.back() + fresh);
      }
      const int64_t T = ab.query_start.back();
      Tensor qkv = random_host({T, width}, DType::kF32);
      Tensor qkv_d = to_device(qkv);
      // q, k, v: column slices of the packed rows, as [T, heads, D].
      auto heads = [&](const Tensor& t, int64_t first_head, int64_t n) {
        return t.view().columns(first_head * D, n * D).reshape({T, n, D});
      };
      cpu_->write_kv(heads(qkv, q_heads, kv_heads), heads(qkv, q_heads + kv_heads, kv_heads), ab, kc, vc);
      cuda_->write_kv(heads(qkv_d, q_heads, kv_heads), heads(qkv_d, q_heads + kv_heads, kv_heads), ab, kc_d, vc_d);
      Tensor ref = Tensor::zeros({T, q_heads * D}, DType::kF32), out = cuda_->alloc({T, q_heads * D}, DType::kF32);
      AttentionParams params;
      params.scale = 0.125f;
      cpu_->attention(heads(qkv, 0, q_heads), ab, kc, vc, params, ref);
      cuda_->attention(heads(qkv_d, 0, q_heads), ab, kc_d, vc_d, params, out);
      expect_close(widen(ref), device_f32(out), 1e-5, 1e-5,
                   std::string("step ") + std::to_string(step) + " " + dtype_name(ct));
    }
    expect_close(widen(kc), device_f32(kc_d), 0, 0, std::string("k cache after the steps ") + dtype_name(ct));
  }
}

}  // namespace
}  // namespace tessera
