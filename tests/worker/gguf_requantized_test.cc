// GGUF files as llama-quantize rewrites a converter's file, two ways that file differs from
// the converter's own and that Tessera must read as llama.cpp does:
//  - every tensor's dimensions listed up to its last one above 1 (ggml_n_dims): Qwen2-MoE's
//    [1, hidden] shared-expert gate, two dimensions from the converter, is one afterwards;
//  - matrices left in floats beside quantized ones: a matrix whose input width the type
//    cannot block (tiny-llama's 344-wide down projection under q8_0 or Q4_K_M falls back to
//    F16) or one a --tensor-type override keeps in floats.
// And two ways of running any quantized file: the plain op path (kernel_inject off), where a
// fused tensor's q, k, v or gate, up are row views of it, and a tensor-parallel split that
// cuts a matrix's blocks.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "common/gguf/gguf_file.h"
#include "tests/test_support.h"
#include "tests/worker/gguf_family_runs.h"
#include "tests/worker/gguf_from_hf.h"
#include "worker/model_checkpoint.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::GgufOutType;

// The file llama-quantize writes for a tensor it leaves as it is: its trailing (outermost)
// dimensions of 1 dropped. Returns how many tensors lost one.
int drop_outer_ones(testing::GgufConversion& conv) {
  int changed = 0;
  for (auto& t : conv.writer.tensors) {
    const size_t before = t.dims.size();
    while (t.dims.size() > 1 && t.dims.back() == 1) t.dims.pop_back();
    changed += t.dims.size() != before ? 1 : 0;
  }
  return changed;
}

TEST(GgufRequantized, OuterDimensionsOfOneLeftOutReadAsTheConvertersFile) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-qwen2-moe";
  const std::vector<testing::FamilyCase> cases = testing::family_goldens(fixture);
  const std::string tmp = testing::make_temp_dir("tessera-gguf-requantized");
  auto conv = testing::gguf_from_hf(fixture, GgufOutType::kF32);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  const std::string as_converted = testing::write_gguf(*conv, tmp, "converted");
  const int changed = drop_outer_ones(*conv);
  ASSERT_GT(changed, 0) << "no tensor of tiny-qwen2-moe has an outer dimension of 1";
  const std::string as_requantized = testing::write_gguf(*conv, tmp, "requantized");
  auto want = testing::run_family(as_converted, cases);
  auto got = testing::run_family(as_requantized, cases);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(testing::compare_runs(*got, *want, "dims as llama-quantize writes them"), 0.0f);
  std::cout << "[ REPORT   ] tiny-qwen2-moe: " << changed << " tensors listed without their outer 1 (one per layer's "
            << "shared-expert gate), the same logits" << std::endl;
  fs::remove_all(tmp);
}

// tiny-llama as q8_0 (its down projections F16, the converter's fallback for 344-wide rows)
// with layer 0's up projection stored in F32 beside its q8_0 gate. Under auto every matrix is
// computed as stored: q8_0 ones as int8, the down projections and layer 0's packed gate|up in
// the compute dtype (before, auto quantized the F16 ones too, and a 344-wide one could not be:
// the file was refused).
TEST(GgufRequantized, MatricesInFloatsBesideBlocksStayInFloats) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-llama";
  const std::vector<testing::FamilyCase> cases = testing::family_goldens(fixture);
  const std::string tmp = testing::make_temp_dir("tessera-gguf-float-matrices");
  auto conv = testing::gguf_from_hf(fixture, GgufOutType::kQ8_0);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  bool rewrote = false;
  for (auto& t : conv->writer.tensors) {
    if (t.name != "blk.0.ffn_up.weight") continue;
    ASSERT_EQ(t.type, static_cast<uint32_t>(GgmlType::kQ8_0));
    ASSERT_TRUE(t.data.has_value());
    const std::vector<float> values = testing::ggml_q8_0_decode(*t.data);
    t.type = static_cast<uint32_t>(GgmlType::kF32);
    t.data = std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    rewrote = true;
  }
  ASSERT_TRUE(rewrote);
  const std::string path = testing::write_gguf(*conv, tmp, "mixed");

  auto ckpt = open_model_checkpoint(path);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto mw = testing::load_weights_auto(**ckpt);
  ASSERT_TRUE(mw.is_ok()) << mw.status().to_string();
  ASSERT_GE(mw->layers.size(), 2u);
  for (size_t l = 0; l < mw->layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights& lw = mw->layers[l];
    EXPECT_EQ(static_cast<GgmlType>((*ckpt)->find("model.layers." + std::to_string(l) + ".mlp.down_proj.weight")->ggml_type),
              GgmlType::kF16);
    EXPECT_EQ(lw.mlp.down.w.dtype(), DType::kF32);
    EXPECT_EQ(lw.mlp.gate_up.w.dtype(), l == 0 ? DType::kF32 : DType::kI8);
    EXPECT_EQ(lw.o.w.dtype(), DType::kI8);
  }

  // Computed so, the file gives the greedy ids of all its values decoded to floats (none).
  auto as_stored = testing::run_family(path, cases, {.kind = WeightQuantization::kAuto});
  auto decoded = testing::run_family(path, cases, {.kind = WeightQuantization::kNone});
  ASSERT_TRUE(as_stored.is_ok()) << as_stored.status().to_string();
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  const float diff = testing::compare_runs(*as_stored, *decoded, "auto against none");
  EXPECT_LE(diff, 2e-2f);
  std::cout << "[ REPORT   ] tiny-llama q8_0 with F16 and F32 matrices: auto against none, ids equal, max |logit| "
            << "diff " << diff << std::endl;
  fs::remove_all(tmp);
}

// Fused tensors (Phi-3's qkv and gate_up, GPT-NeoX's and BLOOM's grouped QKV) as q8_0 on
// the plain op path: q, k, v and gate, up are row views of the one tensor, and each keeps the
// blocks it views (int8 with their own scales under auto), computing what the fused path does.
TEST(GgufRequantized, ViewsOfAFusedTensorKeepItsBlocksOnThePlainPath) {
  TESSERA_REQUIRE_FIXTURES();
  for (const std::string family : {"tiny-phi3", "tiny-gpt-neox", "tiny-bloom"}) {
    SCOPED_TRACE(family);
    const std::string fixture = testing::fixtures_dir() + "/" + family;
    const std::vector<testing::FamilyCase> cases = testing::family_goldens(fixture);
    const std::string tmp = testing::make_temp_dir("tessera-gguf-plain-path");
    auto conv = testing::gguf_from_hf(fixture, GgufOutType::kQ8_0);
    ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
    const std::string path = testing::write_gguf(*conv, tmp, family);

    auto ckpt = open_model_checkpoint(path);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    auto mw = testing::load_weights_auto(**ckpt, /*kernel_inject=*/false);
    ASSERT_TRUE(mw.is_ok()) << mw.status().to_string();
    const LayerWeights& lw = mw->layers[0];
    EXPECT_EQ(lw.q.w.dtype(), DType::kI8);
    EXPECT_EQ(lw.v.w.dtype(), DType::kI8);

    auto fused = testing::run_family(path, cases, {.kind = WeightQuantization::kAuto});
    auto plain = testing::run_family(path, cases, {.kind = WeightQuantization::kAuto, .kernel_inject = false});
    ASSERT_TRUE(fused.is_ok()) << fused.status().to_string();
    ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
    const float diff = testing::compare_runs(*plain, *fused, family + " plain against fused");
    EXPECT_LE(diff, 1e-3f);  // golden_test.cc's bound between the two paths
    std::cout << "[ REPORT   ] " << family << " q8_0 under auto, plain path against fused: ids equal, max |logit| diff "
              << diff << std::endl;
    fs::remove_all(tmp);
  }
}

// tiny-qwen2-moe as q8_0 at tensor-parallel 2: each rank's share of an expert's 32-wide down
// projection is 16 inputs, inside the blocks of 32. The rank decodes its slice, and as 16
// inputs are no whole group for int8 it computes them in the compute dtype (was: refused,
// naming model.quantization_group, which auto gives no way to change); the expert's
// gate|up, split by rows, keeps its blocks.
TEST(GgufRequantized, ASplitInsideBlocksTooNarrowForInt8StaysInFloats) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-qwen2-moe";
  const std::string tmp = testing::make_temp_dir("tessera-gguf-narrow-split");
  auto conv = testing::gguf_from_hf(fixture, GgufOutType::kQ8_0);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  auto ckpt = open_model_checkpoint(testing::write_gguf(*conv, tmp, "qwen2-moe"));
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto mw = testing::load_weights_auto(**ckpt, /*kernel_inject=*/true, rank, 2);
    ASSERT_TRUE(mw.is_ok()) << mw.status().to_string();
    const LayerWeights& lw = mw->layers[0];
    ASSERT_TRUE(lw.moe());
    const LinearWeights& down = lw.experts[0].down;
    EXPECT_EQ(down.w.dtype(), DType::kF32);
    EXPECT_EQ(down.w.dim(1) % 32, 16);
    EXPECT_EQ(lw.experts[0].gate_up.w.dtype(), DType::kI8);
  }
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace tessera
