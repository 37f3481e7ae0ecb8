// The per-head ops (rotary, head_rms_norm, write_kv, attention) and gated_act take views that
// may be strided along dimension 0: the q, k and v column slices of one fused QKV output, or
// the gate and up halves of a packed gate|up output. On the CPU backend each gives, bit for
// bit, what it gives on contiguous copies of the same values, and leaves the columns around
// its slice alone. The fronts refuse a view on another device, of the wrong shape, or with
// rows closer together than their width, with a message that names the op and the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace tessera {
namespace {

// Shapes of one attention layer: 4 query heads over 2 KV heads of 12 dims; the fused row
// holds q | k | v and 5 more columns (as a padded allocation would).
constexpr int64_t kStridedTokens = 7, kStridedQHeads = 4, kStridedKvHeads = 2, kStridedHeadDim = 12;
constexpr int64_t kStridedQWidth = kStridedQHeads * kStridedHeadDim;
constexpr int64_t kStridedKvWidth = kStridedKvHeads * kStridedHeadDim;
constexpr int64_t kStridedRow = kStridedQWidth + 2 * kStridedKvWidth + 5;
constexpr int kStridedBlockSize = 4;

Tensor strided_random(const std::vector<int64_t>& dims, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  Tensor t = Tensor::zeros(dims, DType::kF32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// A contiguous copy of columns [begin, begin + count) of a 2-D tensor.
Tensor contiguous_columns(const Tensor& t, int64_t begin, int64_t count) {
  Tensor c = Tensor::zeros({t.dim(0), count}, DType::kF32);
  for (int64_t r = 0; r < t.dim(0); ++r) {
    std::memcpy(c.data<float>() + r * count, t.data<float>() + r * t.dim(1) + begin, count * sizeof(float));
  }
  return c;
}

bool same_floats(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Columns [begin, begin + count) of `fused` equal `part` bit for bit, and every other column
// equals `before` (the op touched only its slice).
void expect_slice_is(const Tensor& fused, const Tensor& before, int64_t begin, const Tensor& part, const char* what) {
  const int64_t width = fused.dim(1), count = part.dim(1);
  for (int64_t r = 0; r < fused.dim(0); ++r) {
    const float* row = fused.data<float>() + r * width;
    EXPECT_TRUE(same_floats(row + begin, part.data<float>() + r * count, count)) << what << " row " << r;
    EXPECT_TRUE(same_floats(row, before.data<float>() + r * width, begin)) << what << " row " << r << " before";
    EXPECT_TRUE(same_floats(row + begin + count, before.data<float>() + r * width + begin + count,
                            width - begin - count))
        << what << " row " << r << " after";
  }
}

TensorView heads_view(const TensorView& columns, int64_t heads) {
  return columns.reshape({columns.dim(0), heads, kStridedHeadDim});
}

// Two sequences: 5 new tokens after 3 cached, and 2 new tokens from scratch.
AttentionBatch strided_batch() {
  AttentionBatch b;
  b.query_start = {0, 5, 7};
  b.context_lens = {8, 2};
  b.max_blocks_per_seq = 2;
  b.block_tables = {3, 0, 1, -1};
  b.slot_mapping = {3 * kStridedBlockSize + 3, 0, 1, 2, 3, 1 * kStridedBlockSize + 0, 1 * kStridedBlockSize + 1};
  return b;
}

class StridedViewsTest : public ::testing::Test {
 protected:
  CpuBackend backend_{1, CpuKernelOptions{}};
  Tensor qkv_ = strided_random({kStridedTokens, kStridedRow}, 21);
  Tensor gamma_ = strided_random({kStridedHeadDim}, 22, 0.5f, 1.5f);
  Tensor inv_freq_ = strided_random({kStridedHeadDim / 2}, 23, 0.01f, 1.0f);
  std::vector<int32_t> positions_ = {3, 4, 5, 6, 7, 0, 1};
  TensorView positions() { return TensorView(positions_.data(), DType::kI32, {kStridedTokens}); }
  TensorView q() const { return heads_view(qkv_.view().columns(0, kStridedQWidth), kStridedQHeads); }
  TensorView k() const {
    return heads_view(qkv_.view().columns(kStridedQWidth, kStridedKvWidth), kStridedKvHeads);
  }
  TensorView v() const {
    return heads_view(qkv_.view().columns(kStridedQWidth + kStridedKvWidth, kStridedKvWidth), kStridedKvHeads);
  }
  Tensor cache() const {
    return strided_random({4, kStridedBlockSize, kStridedKvHeads, kStridedHeadDim}, 24);
  }
};

TEST_F(StridedViewsTest, ColumnsOfAFusedRowAreStridedViews) {
  const TensorView q2 = qkv_.view().columns(0, kStridedQWidth);
  EXPECT_FALSE(q2.contiguous());
  EXPECT_EQ(q2.row_stride(), kStridedRow);
  EXPECT_EQ(q2.dims(), (std::vector<int64_t>{kStridedTokens, kStridedQWidth}));
  EXPECT_EQ(q2.shape_string(), "[7, 48] (row stride 101)");
  const TensorView k3 = k();
  EXPECT_EQ(k3.row_stride(), kStridedRow);
  EXPECT_EQ(k3.as<float>(), qkv_.data<float>() + kStridedQWidth);
  // Rows keep the stride; one row is contiguous again.
  const TensorView rows = k3.rows(2, 3);
  EXPECT_EQ(rows.as<float>(), qkv_.data<float>() + 2 * kStridedRow + kStridedQWidth);
  EXPECT_EQ(rows.row_stride(), kStridedRow);
  EXPECT_TRUE(k3.row(4).contiguous());
  EXPECT_EQ(k3.row(4).as<float>(), qkv_.data<float>() + 4 * kStridedRow + kStridedQWidth);
  // Whole rows, and the default of every constructed view, are contiguous.
  EXPECT_TRUE(qkv_.view().columns(0, kStridedRow).contiguous());
  EXPECT_TRUE(qkv_.view().contiguous());
  EXPECT_EQ(qkv_.view().row_stride(), kStridedRow);
}

TEST_F(StridedViewsTest, OpsOnFusedQkvSlicesMatchContiguousCopies) {
  Tensor q_c = contiguous_columns(qkv_, 0, kStridedQWidth);
  Tensor k_c = contiguous_columns(qkv_, kStridedQWidth, kStridedKvWidth);
  Tensor v_c = contiguous_columns(qkv_, kStridedQWidth + kStridedKvWidth, kStridedKvWidth);
  const Tensor before = contiguous_columns(qkv_, 0, kStridedRow);
  auto q_ch = heads_view(q_c.view(), kStridedQHeads);
  auto k_ch = heads_view(k_c.view(), kStridedKvHeads);
  auto v_ch = heads_view(v_c.view(), kStridedKvHeads);

  backend_.head_rms_norm(q(), gamma_, 1e-6f);
  backend_.rotary(q(), positions(), inv_freq_);
  backend_.head_rms_norm(q_ch, gamma_, 1e-6f);
  backend_.rotary(q_ch, positions(), inv_freq_);
  expect_slice_is(qkv_, before, 0, q_c, "q after norm and rotary");
  const Tensor before_k = contiguous_columns(qkv_, 0, kStridedRow);
  backend_.head_rms_norm(k(), gamma_, 1e-6f);
  backend_.rotary(k(), positions(), inv_freq_);
  backend_.head_rms_norm(k_ch, gamma_, 1e-6f);
  backend_.rotary(k_ch, positions(), inv_freq_);
  expect_slice_is(qkv_, before_k, kStridedQWidth, k_c, "k after norm and rotary");  // v and the padding too

  const AttentionBatch batch = strided_batch();
  Tensor kc = cache(), vc = cache(), kc_c = cache(), vc_c = cache();
  backend_.write_kv(k(), v(), batch, kc, vc);
  backend_.write_kv(k_ch, v_ch, batch, kc_c, vc_c);
  EXPECT_TRUE(same_floats(kc.data<float>(), kc_c.data<float>(), kc.numel()));
  EXPECT_TRUE(same_floats(vc.data<float>(), vc_c.data<float>(), vc.numel()));

  AttentionParams params;
  params.scale = 0.3f;
  Tensor out = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  Tensor out_c = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  backend_.attention(q(), batch, kc, vc, params, out);
  backend_.attention(q_ch, batch, kc_c, vc_c, params, out_c);
  EXPECT_TRUE(same_floats(out.data<float>(), out_c.data<float>(), out.numel()));
  // The reference kernel reads the stride too.
  CpuKernelOptions reference_options;
  reference_options.attention = cpu::AttentionKernel::kReference;
  CpuBackend reference(1, reference_options);
  Tensor out_r = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  Tensor out_rc = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  reference.attention(q(), batch, kc, vc, params, out_r);
  reference.attention(q_ch, batch, kc_c, vc_c, params, out_rc);
  EXPECT_TRUE(same_floats(out_r.data<float>(), out_rc.data<float>(), out_r.numel()));
}

TEST_F(StridedViewsTest, GatedActOnColumnHalvesMatchesSeparateBuffers) {
  const int64_t T = 5, F = 19;
  const Tensor gate_up = strided_random({T, 2 * F + 3}, 31);
  const TensorView gate = gate_up.view().columns(0, F), up = gate_up.view().columns(F, F);
  const Tensor gate_c = contiguous_columns(gate_up, 0, F), up_c = contiguous_columns(gate_up, F, F);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    Tensor out = Tensor::zeros({T, F}, DType::kF32), out_c = Tensor::zeros({T, F}, DType::kF32);
    backend_.gated_act(gate, up, out, act);
    backend_.gated_act(gate_c, up_c, out_c, act);
    EXPECT_TRUE(same_floats(out.data<float>(), out_c.data<float>(), out.numel()));
  }
  // The packed form is the same op on the two halves of a contiguous [T, 2F] buffer.
  const Tensor packed = contiguous_columns(gate_up, 0, 2 * F);
  Tensor out_p = Tensor::zeros({T, F}, DType::kF32), out_c = Tensor::zeros({T, F}, DType::kF32);
  backend_.gated_act_packed(packed, out_p, Activation::kSilu);
  backend_.gated_act(gate_c, up_c, out_c, Activation::kSilu);
  EXPECT_TRUE(same_floats(out_p.data<float>(), out_c.data<float>(), out_p.numel()));
}

// The same view labelled as another device's memory (never dereferenced: the front refuses it).
TensorView on_cuda(TensorView v) {
  v.device = DeviceKind::kCuda;
  return v;
}

// Rows closer together than their width.
TensorView overlapping_rows(TensorView v) {
  v.stride0 = v.row_numel() - 1;
  return v;
}

using StridedViewsDeathTest = StridedViewsTest;

TEST_F(StridedViewsDeathTest, FrontsRefuseViewsOnAnotherDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const AttentionBatch batch = strided_batch();
  Tensor kc = cache(), vc = cache();
  Tensor out = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  EXPECT_DEATH(backend_.rotary(on_cuda(q()), positions(), inv_freq_),
               "rotary: x is CUDA memory; the cpu backend needs it in host memory");
  EXPECT_DEATH(backend_.rotary(q(), on_cuda(positions()), inv_freq_), "rotary: positions must be i32 \\[tokens\\] in host memory");
  EXPECT_DEATH(backend_.rotary(q(), positions(), on_cuda(inv_freq_)), "rotary: inv_freq is CUDA memory.*place_weight");
  EXPECT_DEATH(backend_.head_rms_norm(q(), on_cuda(gamma_), 1e-6f), "head_rms_norm: gamma is CUDA memory");
  EXPECT_DEATH(backend_.write_kv(k(), on_cuda(v()), batch, kc, vc), "write_kv: v is CUDA memory");
  EXPECT_DEATH(backend_.write_kv(k(), v(), batch, kc, on_cuda(vc)), "write_kv: v_cache is CUDA memory");
  EXPECT_DEATH(backend_.attention(on_cuda(q()), batch, kc, vc, {}, out), "attention: q is CUDA memory");
  EXPECT_DEATH(backend_.attention(q(), batch, kc, vc, {}, on_cuda(out)), "attention: out is CUDA memory");
  const TensorView gate = qkv_.view().columns(0, 10), up = qkv_.view().columns(10, 10);
  Tensor g_out = Tensor::zeros({kStridedTokens, 10}, DType::kF32);
  EXPECT_DEATH(backend_.gated_act(gate, on_cuda(up), g_out, Activation::kSilu), "gated_act: up is CUDA memory");
}

TEST_F(StridedViewsDeathTest, FrontsRefuseWrongShapesAndStrides) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const AttentionBatch batch = strided_batch();
  Tensor kc = cache(), vc = cache();
  Tensor out = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  // Heads must be 3-D, rows no closer than heads * head_dim.
  EXPECT_DEATH(backend_.head_rms_norm(qkv_.view().columns(0, kStridedQWidth), gamma_, 1e-6f),
               "head_rms_norm: x must be \\[tokens, heads, head_dim\\], got \\[7, 48\\] \\(row stride 101\\)");
  EXPECT_DEATH(backend_.rotary(overlapping_rows(q()), positions(), inv_freq_), "rotary: x .*row stride below");
  EXPECT_DEATH(backend_.write_kv(overlapping_rows(k()), overlapping_rows(v()), batch, kc, vc),
               "write_kv: k .*row stride below");
  // One position per token; gamma as wide as a head.
  EXPECT_DEATH(backend_.rotary(q().rows(0, 6), positions(), inv_freq_), "rotary: one position per token");
  EXPECT_DEATH(backend_.head_rms_norm(q(), inv_freq_, 1e-6f), "head_rms_norm: one gamma per dim");
  // k and v alike, and shaped as the cache.
  EXPECT_DEATH(backend_.write_kv(k(), heads_view(contiguous_columns(qkv_, 0, kStridedKvWidth), kStridedKvHeads),
                                 batch, kc, vc),
               "write_kv: k and v rows must be spaced alike");
  const TensorView k_as_one_head = qkv_.view().columns(kStridedQWidth, kStridedKvWidth).reshape(
      {kStridedTokens, 1, kStridedKvWidth});
  EXPECT_DEATH(backend_.write_kv(k_as_one_head, k_as_one_head, batch, kc, vc), "write_kv: k .* into a cache of");
  EXPECT_DEATH(backend_.write_kv(k().rows(0, 6), v().rows(0, 6), batch, kc, vc), "slot_mapping");
  // q's head_dim is the cache's; out has one row per token and is contiguous.
  const TensorView q_wide_heads =
      qkv_.view().columns(0, kStridedQWidth).reshape({kStridedTokens, kStridedQHeads / 2, 2 * kStridedHeadDim});
  EXPECT_DEATH(backend_.attention(q_wide_heads, batch, kc, vc, {}, out), "attention: q .* over a cache of");
  EXPECT_DEATH(backend_.attention(q().rows(0, 6), batch, kc, vc, {}, out), "attention: q .* out");
  Tensor wide_out = Tensor::zeros({kStridedTokens, kStridedQWidth + 1}, DType::kF32);
  EXPECT_DEATH(backend_.attention(q(), batch, kc, vc, {}, wide_out.view().columns(0, kStridedQWidth)),
               "attention out must be contiguous");
  // gate and up spaced alike; out contiguous.
  Tensor g_out = Tensor::zeros({kStridedTokens, 10}, DType::kF32);
  const Tensor up_c = contiguous_columns(qkv_, 10, 10);
  EXPECT_DEATH(backend_.gated_act(qkv_.view().columns(0, 10), up_c, g_out, Activation::kSilu),
               "gated_act: gate and up rows must be spaced alike");
  EXPECT_DEATH(backend_.gated_act(qkv_.view().columns(0, 10), qkv_.view().columns(10, 10),
                                  qkv_.view().columns(20, 10), Activation::kSilu),
               "gated_act out must be contiguous");
}

// LongRoPE's attention factor: rotary with magnitude m gives m times the pure rotation in the
// rotated dims (to rounding: cos and sin are scaled before the products) and leaves the
// partial rotary's other dims as they were, bit for bit.
TEST(RotaryMagnitude, ScalesTheRotatedDimsOnly) {
  CpuBackend backend(1);
  constexpr int64_t kTokens = 5, kHeads = 3, kHeadDim = 16, kRotHalf = 6;  // 12 of 16 dims rotate
  const Tensor x = strided_random({kTokens, kHeads * kHeadDim}, 7);
  Tensor pure = contiguous_columns(x, 0, kHeads * kHeadDim), scaled = contiguous_columns(x, 0, kHeads * kHeadDim);
  Tensor inv_freq = Tensor::zeros({kRotHalf}, DType::kF32);
  for (int64_t i = 0; i < kRotHalf; ++i) inv_freq.data<float>()[i] = 1.0f / std::pow(10000.0f, 2.0f * i / 12.0f);
  std::vector<int32_t> pos = {0, 3, 17, 900, 4097};
  const TensorView positions(pos.data(), DType::kI32, {kTokens});
  constexpr float kMagnitude = 1.19f;
  backend.rotary(pure.view().reshape({kTokens, kHeads, kHeadDim}), positions, inv_freq.view());
  backend.rotary(scaled.view().reshape({kTokens, kHeads, kHeadDim}), positions, inv_freq.view(), kMagnitude);
  for (int64_t i = 0; i < kTokens * kHeads * kHeadDim; ++i) {
    const float p = pure.data<float>()[i], s = scaled.data<float>()[i];
    if (i % kHeadDim < 2 * kRotHalf) {
      EXPECT_NEAR(s, kMagnitude * p, 1e-6f + 1e-6f * std::fabs(s)) << "element " << i;
    } else {
      EXPECT_EQ(s, x.data<float>()[i]) << "element " << i << " is not rotated";
    }
  }
}

TEST_F(StridedViewsDeathTest, ContiguousOnlyOperationsRefuseStridedViews) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> host(kStridedTokens * kStridedQWidth);
  EXPECT_DEATH(backend_.copy_to_host(qkv_.view().columns(0, kStridedQWidth), host.data()),
               "copy_to_host: \\[7, 48\\] \\(row stride 101\\) is strided");
  EXPECT_DEATH(backend_.copy_from_host(host.data(), qkv_.view().columns(0, kStridedQWidth)),
               "copy_from_host: .* is strided");
  EXPECT_DEATH(qkv_.view().columns(0, kStridedQWidth).reshape({kStridedTokens * kStridedQWidth}),
               "a strided view can only be reshaped within its rows");
  Tensor out = Tensor::zeros({kStridedTokens, kStridedQWidth}, DType::kF32);
  EXPECT_DEATH(backend_.rms_norm(qkv_.view().columns(0, kStridedQWidth), gamma_, 1e-6f, out),
               "rms_norm x must be contiguous");
}

}  // namespace
}  // namespace tessera
