// GGUF files of every family Tessera serves, without llama.cpp: each tiny-<family> fixture is
// converted as llama.cpp's convert_hf_to_gguf.py converts it (tests/worker/gguf_from_hf.h:
// its metadata keys, tensor names, Q/K permutation, regrouped QKV, transposed Conv1D, Gemma's
// 1 + w norms, stacked experts), loaded through --model FILE.gguf's path (Transformer::load)
// and run as golden_test.cc runs the folder (float32, all cases in one batch):
//  - against the folder itself (the same weights): ids equal, logits within 1e-5;
//  - against the fixture's goldens (transformers' numbers): ids equal, logits within 1e-3
//    (golden_test's f32 bound), on every row the file can describe;
//  - as q8_0 (--outtype q8_0: f16 where rows are not whole blocks) against the f32 file of
//    the same decoded values: ids equal, logits within 1e-5, so the quantized path reads the
//    blocks, the permuted and regrouped rows and the stacked experts exactly.
// Where the format cannot carry a setting of the fixture (GgufConversion::lost: Mistral's and
// StarCoder2's sliding window, Gemma 2's query_pre_attn_scalar, the exact GELU of Falcon and
// GPT-NeoX, where llama.cpp computes the tanh one), the "folder" is a copy whose
// config.json says what llama.cpp's loader assumes instead, and the goldens are compared only
// on the rows the setting does not touch (for a window: rows whose whole context fits in it);
// each such case says so in its report line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/config.h"
#include "common/safetensors_writer.h"
#include "kernels/backend.h"
#include "tests/test_support.h"
#include "tests/worker/gguf_family_runs.h"
#include "tests/worker/gguf_from_hf.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "common/gguf/gguf_file.h"
#include "worker/generator.h"
#include "worker/model_checkpoint.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/transformer.h"
#include "worker/weight_quantization.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::GgufConversion;
using testing::GgufOutType;
using testing::compare_runs;
using testing::family_goldens;
using testing::FamilyCase;
using testing::FamilyRun;
using testing::run_family;
using testing::write_gguf;

constexpr float kGoldenBound = 1e-3f;  // golden_test.cc's f32 bound
constexpr float kSameWeightsBound = 1e-5f;

// A folder of `fixture`'s weights (linked) under its config.json with `edits` applied.
std::string fixture_with_config(const std::string& fixture, const std::string& dir, const nlohmann::json& edits) {
  fs::create_directories(dir);
  nlohmann::json config = nlohmann::json::parse(testing::read_file(fixture + "/config.json"));
  for (const auto& [key, value] : edits.items()) config[key] = value;
  testing::write_file(dir + "/config.json", config.dump(2));
  fs::create_symlink(fs::absolute(fixture + "/model.safetensors"), dir + "/model.safetensors");
  return dir;
}

// A folder with the fixture's weights (linked) and its config.json changed to what the GGUF
// file says: the model the file describes, in Hugging Face form.
std::string describe_as_file(const std::string& fixture, const GgufConversion& conv, const std::string& dir) {
  nlohmann::json edits = nlohmann::json::object();
  for (const testing::GgufLostSetting& l : conv.lost) edits[l.key] = l.gguf_value;
  return fixture_with_config(fixture, dir + "/as-gguf", edits);
}

// How many leading rows of a case the goldens may be compared on: all of them unless a
// setting the file lacks changes the numbers; for a sliding window the rows whose context
// (prompt and the ids before the row) fits in it; for anything else none.
size_t golden_rows(const FamilyCase& c, const GgufConversion& conv) {
  size_t rows = c.greedy.size();
  for (const testing::GgufLostSetting& l : conv.lost) {
    if (l.key == "sliding_window" && l.hf_value.is_number_integer() && l.gguf_value.is_null()) {
      const int64_t window = l.hf_value.get<int64_t>();
      const int64_t fit = window - static_cast<int64_t>(c.prompt.size()) + 1;
      rows = std::min(rows, static_cast<size_t>(std::max<int64_t>(0, fit)));
    } else {
      rows = 0;
    }
  }
  return rows;
}

std::string lost_line(const GgufConversion& conv) {
  std::string out;
  for (const testing::GgufLostSetting& l : conv.lost)
    out += (out.empty() ? "" : "; ") + l.key + " " + l.hf_value.dump() + " -> " + l.gguf_value.dump() + " (" + l.reason + ")";
  for (const std::string& n : conv.notes) out += (out.empty() ? "" : "; ") + n;
  return out.empty() ? "none" : out;
}

// Converts `folder` (f32, q8_0 and q8_0's f32 twin), runs each file and the folder (or the
// model the file describes), and checks them as the header says. The prompts are those of
// `fixture`'s goldens, which are compared too when `compare_goldens`.
void check_family_files(const std::string& name, const std::string& folder, const std::string& fixture,
                        bool compare_goldens) {
  const std::vector<FamilyCase> cases = family_goldens(fixture);
  const std::string tmp = testing::make_temp_dir("tessera-gguf-family");
  auto conv = testing::gguf_from_hf(folder, GgufOutType::kF32);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  const std::string reference_dir = conv->lost.empty() ? folder : describe_as_file(folder, *conv, tmp);
  auto gguf = run_family(write_gguf(*conv, tmp, name), cases);
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  auto reference = run_family(reference_dir, cases);
  ASSERT_TRUE(reference.is_ok()) << reference.status().to_string();
  const float vs_folder = compare_runs(*gguf, *reference, name + " gguf vs folder");
  EXPECT_LE(vs_folder, kSameWeightsBound) << name;

  // Goldens, on the rows the file can describe.
  float vs_goldens = 0;
  size_t rows_compared = 0, rows_total = 0;
  if (compare_goldens) {
    const int64_t vocab = gguf->vocab;
    for (size_t i = 0; i < cases.size(); ++i) {
      const FamilyCase& c = cases[i];
      const GenerationResult& r = gguf->results[i];
      const size_t rows = golden_rows(c, *conv);
      rows_total += c.greedy.size();
      rows_compared += rows;
      for (size_t s = 0; s < rows; ++s) {
        EXPECT_EQ(r.output[s], c.greedy[s]) << name << " case " << i << " row " << s;
        float row_err = 0;
        for (int64_t v = 0; v < vocab; ++v)
          row_err = std::max(row_err, std::fabs(r.logits[s * vocab + v] - c.logits[s * vocab + v]));
        EXPECT_LE(row_err, kGoldenBound) << name << " case " << i << " row " << s;
        vs_goldens = std::max(vs_goldens, row_err);
      }
    }
  }

  // q8_0 against the f32 file of the very values its blocks decode to.
  auto q8 = testing::gguf_from_hf(folder, GgufOutType::kQ8_0);
  auto q8_twin = testing::gguf_from_hf(folder, GgufOutType::kQ8_0AsF32);
  ASSERT_TRUE(q8.is_ok() && q8_twin.is_ok()) << q8.status().to_string() << " " << q8_twin.status().to_string();
  auto q8_run = run_family(write_gguf(*q8, tmp, name + "-Q8_0"), cases);
  ASSERT_TRUE(q8_run.is_ok()) << q8_run.status().to_string();
  auto q8_twin_run = run_family(write_gguf(*q8_twin, tmp, name + "-Q8_0-as-F32"), cases);
  ASSERT_TRUE(q8_twin_run.is_ok()) << q8_twin_run.status().to_string();
  const float q8_exact = compare_runs(*q8_run, *q8_twin_run, name + " q8_0 vs its f32 twin");
  EXPECT_LE(q8_exact, kSameWeightsBound) << name;
  float q8_vs_f32 = 0;
  for (size_t i = 0; i < cases.size(); ++i) {  // reported: rows while the ids agree
    const int64_t vocab = gguf->vocab;
    for (size_t s = 0; s < cases[i].greedy.size(); ++s) {
      for (int64_t v = 0; v < vocab; ++v)
        q8_vs_f32 = std::max(q8_vs_f32, std::fabs(q8_run->results[i].logits[s * vocab + v] -
                                                  gguf->results[i].logits[s * vocab + v]));
      if (q8_run->results[i].output[s] != gguf->results[i].output[s]) break;
    }
  }

  std::cout << "[ REPORT   ] " << name << " (" << conv->arch << "): max |logit| diff vs goldens = " << vs_goldens
            << " on " << rows_compared << " of " << rows_total << " rows, vs folder = " << vs_folder
            << ", q8_0 vs its f32 twin = " << q8_exact << ", q8_0 vs f32 = " << q8_vs_f32
            << "; not in the format: " << lost_line(*conv) << std::endl;
  fs::remove_all(tmp);
}

class GgufFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufFamilyTest, ConvertedAsLlamaCppDoesAndReadBack) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string folder = testing::fixtures_dir() + "/" + GetParam();
  const nlohmann::json config = nlohmann::json::parse(testing::read_file(folder + "/config.json"));
  if (config.contains("mlp_only_layers") && !config["mlp_only_layers"].empty()) {
    // gguf-py's qwen2moe/qwen3moe tensor lists have no dense FFN: llama.cpp's converter raises
    // "Can not map tensor" on such a layer, and its loader expects experts in every layer.
    auto conv = testing::gguf_from_hf(folder);
    ASSERT_FALSE(conv.is_ok()) << GetParam() << " has dense layers (mlp_only_layers) and still converted";
    EXPECT_NE(conv.status().message().find("Can not map tensor 'model.layers."), std::string::npos)
        << conv.status().message();
    std::cout << "[ REPORT   ] " << GetParam() << ": not convertible, as with llama.cpp (mlp_only_layers "
              << config["mlp_only_layers"].dump() << ": " << conv.status().message()
              << "); GgufQwen3Moe.EveryLayerSparse covers the qwen3moe reader" << std::endl;
    return;
  }
  check_family_files(GetParam(), folder, folder, true);
}

std::string family_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string m = info.param;
  for (char& ch : m)
    if (ch == '-') ch = '_';
  return m;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufFamilyTest, ::testing::ValuesIn(testing::tiny_models()), family_name);

// The largest logit difference between two runs of the same cases (ids not compared).
float largest_logit_difference(const FamilyRun& a, const FamilyRun& b) {
  float worst = 0;
  for (size_t i = 0; i < a.results.size(); ++i) {
    const auto& x = a.results[i].logits;
    const auto& y = b.results[i].logits;
    for (size_t k = 0; k < std::min(x.size(), y.size()); ++k) worst = std::max(worst, std::fabs(x[k] - y[k]));
  }
  return worst;
}

// A run against the fixture's goldens on every row: ids equal; the largest logit difference.
float difference_from_goldens(const FamilyRun& run, const std::vector<FamilyCase>& cases) {
  float worst = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (size_t r = 0; r < run.results[i].output.size(); ++r) {
      EXPECT_EQ(run.results[i].output[r], cases[i].greedy[r]) << "case " << i << " row " << r;
      for (int64_t v = 0; v < run.vocab; ++v)
        worst = std::max(worst, std::fabs(run.results[i].logits[r * run.vocab + v] - cases[i].logits[r * run.vocab + v]));
    }
  }
  return worst;
}

// Phi-3's LongRoPE (Phi-3.5, Phi-4-mini): tiny-phi3's weights under a config with long and
// short factors and an original context of 32 in a context of 256. The GGUF file (factors as
// rope_factors_long/short.weight, the attention factor as rope.scaling.attn_factor) gives the
// folder's logits serving 256 tokens (the long factors) and serving 32 (the short ones), and
// the two differ; with short factors of 1 and an attention factor of 1, serving 32 tokens is
// plain RoPE: the fixture's goldens (transformers' numbers).
TEST(GgufPhi3LongRope, FactorsReadBackAsTheFolderInBothRegimes) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-phi3";
  const std::vector<FamilyCase> cases = family_goldens(fixture);
  const std::string tmp = testing::make_temp_dir("tessera-gguf-longrope");
  auto folder_with = [&](const std::string& name, const nlohmann::json& rope_scaling) {
    return fixture_with_config(fixture, tmp + "/" + name,
                               {{"max_position_embeddings", 256}, {"original_max_position_embeddings", 32},
                                {"rope_scaling", rope_scaling}});
  };
  const std::string longrope = folder_with(
      "longrope", {{"type", "longrope"},
                   {"short_factor", {1.0, 1.05, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0}},
                   {"long_factor", {1.0, 1.3, 2.1, 3.7, 6.0, 9.5, 14.0, 21.0}}});
  auto conv = testing::gguf_from_hf(longrope, GgufOutType::kF32);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  const std::string gguf = write_gguf(*conv, tmp, "phi3-longrope");
  float worst = 0;
  std::vector<FamilyRun> folder_runs;
  for (const int64_t served : {int64_t{0}, int64_t{32}}) {
    auto from_file = run_family(gguf, cases, {served});
    auto from_folder = run_family(longrope, cases, {served});
    ASSERT_TRUE(from_file.is_ok() && from_folder.is_ok())
        << from_file.status().to_string() << " " << from_folder.status().to_string();
    worst = std::max(worst, compare_runs(*from_file, *from_folder, "longrope gguf vs folder"));
    folder_runs.push_back(std::move(from_folder).value());
  }
  EXPECT_LE(worst, kSameWeightsBound);
  const float long_vs_short = largest_logit_difference(folder_runs[0], folder_runs[1]);
  EXPECT_GT(long_vs_short, 1e-2f) << "the long and the short factors gave the same logits";

  const std::string unit = folder_with("unit", {{"rope_type", "longrope"},
                                                {"short_factor", std::vector<double>(8, 1.0)},
                                                {"long_factor", std::vector<double>(8, 4.0)},
                                                {"attention_factor", 1.0}});
  auto plain = run_family(unit, cases, {32});
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  const float vs_goldens = difference_from_goldens(*plain, cases);
  EXPECT_LE(vs_goldens, kGoldenBound);
  std::cout << "[ REPORT   ] phi3 LongRoPE: gguf vs folder " << worst << " (long and short factors), long vs short "
            << long_vs_short << ", unit factors vs goldens " << vs_goldens << std::endl;
  fs::remove_all(tmp);
}

// YaRN (Qwen 2.5 / Qwen 3 long context) on tiny-qwen2's weights: the GGUF file (rope.scaling.type
// yarn, factor, original context, betas) gives the folder's logits, for the default betas and
// for given ones; YaRN changes them (against plain RoPE); a factor of 1 is plain RoPE: the
// fixture's goldens.
TEST(GgufYarn, ScalingReadsBackAsTheFolderAndFactorOneIsPlainRope) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-qwen2";
  const std::vector<FamilyCase> cases = family_goldens(fixture);
  const std::string tmp = testing::make_temp_dir("tessera-gguf-yarn");
  auto folder_with = [&](const std::string& name, const nlohmann::json& rope_scaling) {
    return fixture_with_config(fixture, tmp + "/" + name, {{"rope_scaling", rope_scaling}});
  };
  auto plain = run_family(fixture, cases);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  float worst = 0, vs_plain = 1e9f;
  for (const nlohmann::json& rs :
       {nlohmann::json{{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}},
        nlohmann::json{{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 32},
                       {"beta_fast", 16.0}, {"beta_slow", 2.0}}}) {
    const std::string folder = folder_with("yarn" + std::to_string(rs["factor"].get<int>()), rs);
    auto conv = testing::gguf_from_hf(folder, GgufOutType::kF32);
    ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
    auto from_file = run_family(write_gguf(*conv, tmp, "yarn" + std::to_string(rs["factor"].get<int>())), cases);
    auto from_folder = run_family(folder, cases);
    ASSERT_TRUE(from_file.is_ok() && from_folder.is_ok())
        << from_file.status().to_string() << " " << from_folder.status().to_string();
    worst = std::max(worst, compare_runs(*from_file, *from_folder, "yarn gguf vs folder"));
    vs_plain = std::min(vs_plain, largest_logit_difference(*from_folder, *plain));
  }
  EXPECT_LE(worst, kSameWeightsBound);
  EXPECT_GT(vs_plain, 1e-2f) << "YaRN gave plain RoPE's logits";

  auto unit = run_family(folder_with("unit", {{"type", "yarn"}, {"factor", 1.0}, {"original_max_position_embeddings", 16}}),
                         cases);
  ASSERT_TRUE(unit.is_ok()) << unit.status().to_string();
  const float vs_goldens = difference_from_goldens(*unit, cases);
  EXPECT_LE(vs_goldens, kGoldenBound);
  std::cout << "[ REPORT   ] qwen2 YaRN: gguf vs folder " << worst << ", against plain RoPE at least " << vs_plain
            << ", factor 1 vs goldens " << vs_goldens << std::endl;
  fs::remove_all(tmp);
}

// model.quantization auto (the default): a file of quantized blocks (q8_0 here) is stored as int8
// with a scale per 32 inputs (its LM head too), one of floats as it is; none keeps the decoded floats.
TEST(GgufAutoQuantization, QuantizedBlocksBecomeInt8FloatsStayFloats) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string folder = testing::fixtures_dir() + "/tiny-qwen2";
  const std::string tmp = testing::make_temp_dir("tessera-gguf-auto");
  auto q8 = testing::gguf_from_hf(folder, GgufOutType::kQ8_0);
  auto f32 = testing::gguf_from_hf(folder, GgufOutType::kF32);
  ASSERT_TRUE(q8.is_ok() && f32.is_ok()) << q8.status().to_string() << " " << f32.status().to_string();
  const std::string q8_path = write_gguf(*q8, tmp, "auto-Q8_0"), f32_path = write_gguf(*f32, tmp, "auto-F32");
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  int64_t table_bytes = 0;  // the last load's embedding table
  auto weight_bytes = [&](const std::string& path, WeightQuantization kind, int group = kAutoQuantGroup,
                          const std::string& rule = "") -> int64_t {
    ModelLoadOptions lo;
    lo.dtype = DType::kF32;
    lo.quant.kind = kind;
    lo.quant.group = group;
    if (!rule.empty()) {
      QuantRuleConfig r;
      r.match = rule;
      r.quantize = WeightQuantization::kInt8;
      EXPECT_TRUE(compile_quant_rule_regex(&r).is_ok());
      lo.quant.rules.push_back(r);
    }
    auto model = Transformer::load(path, lo, **backend);
    EXPECT_TRUE(model.is_ok()) << model.status().to_string();
    if (!model.is_ok()) return -1;
    table_bytes = static_cast<int64_t>((*model)->weights().embed.nbytes());
    return (*model)->weights().total_bytes;
  };
  const int64_t q8_auto = weight_bytes(q8_path, WeightQuantization::kAuto);
  const int64_t auto_table = table_bytes;
  const int64_t q8_none = weight_bytes(q8_path, WeightQuantization::kNone);
  // auto keeps the blocks' scale per 32 inputs, and quantizes the LM head the file stores in
  // blocks, as int8 does when a rule asks; its table stays in the blocks (34 bytes per 32
  // values), which int8 decodes to floats.
  const int64_t q8_int8 = weight_bytes(q8_path, WeightQuantization::kInt8, 32, "lm_head");
  EXPECT_EQ(auto_table * 32 / 34 * 4, table_bytes);
  EXPECT_EQ(q8_auto - auto_table, q8_int8 - table_bytes);
  EXPECT_LT(q8_auto, q8_none);
  EXPECT_EQ(weight_bytes(f32_path, WeightQuantization::kAuto), weight_bytes(f32_path, WeightQuantization::kNone));
  fs::remove_all(tmp);
}

// auto on K-quant mixes (llama.cpp's own Q4_K_M and Q5_K_M files): every quantized matrix
// becomes panels of its own bits (q4_K 4-bit, q5_K 5-bit, q6_K 6-bit: some layers' V and
// down projection, the LM head), each value for value (their logits:
// GgufGenerate.FourBitFilesWithTheDefaultQuantization). A layer whose V is q6_K beside a Q
// and K of another type keeps three matrices rather than one decoded to int8.
// (and the untied embedding in its own blocks, Backend::embedding_ggml)
TEST(GgufAutoQuantization, KQuantMixesKeepEveryMatrixInItsOwnPanels) {
  TESSERA_REQUIRE_FIXTURES();
  for (const std::string file : {"gguf-llama-Q4_K_M", "gguf-llama-Q5_K_M"}) {
    SCOPED_TRACE(file);
    const std::string path = testing::fixtures_dir() + "/gguf/" + file + ".gguf";
    if (!fs::exists(path)) GTEST_SKIP() << "SKIPPED: no " << path;
    auto ckpt = open_model_checkpoint(path);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    auto backend = make_backend("cpu");
    ASSERT_TRUE(backend.is_ok());
    ModelLoadOptions lo;
    lo.quant.kind = WeightQuantization::kAuto;
    auto model = Transformer::load(path, lo, **backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const ModelWeights& w = (*model)->weights();
    // The panels' step size and the scales' dtype and record name the scheme.
    auto scheme_of = [](const LinearWeights& l) {
      EXPECT_EQ(l.w.dtype(), DType::kU8);
      return int4_scheme_of(l.w.view(), l.scales.view());
    };
    // What the file stores, under the Hugging Face names the reader presents (blk.N.attn_q:
    // model.layers.N.self_attn.q_proj), and the scheme that holds it.
    auto expected = [&](const std::string& name) -> std::optional<Int4Scheme> {
      const TensorInfo* info = (*ckpt)->find(name);
      EXPECT_NE(info, nullptr) << name;
      if (info == nullptr) return std::nullopt;
      return panel_scheme_of_blocks(static_cast<GgmlType>(info->ggml_type), /*auto_kind=*/true);
    };
    int mixed = 0;
    for (size_t l = 0; l < w.layers.size(); ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      const LayerWeights& lw = w.layers[l];
      const std::string blk = "model.layers." + std::to_string(l) + ".";
      const auto q = expected(blk + "self_attn.q_proj.weight"), k = expected(blk + "self_attn.k_proj.weight"),
                 v = expected(blk + "self_attn.v_proj.weight");
      ASSERT_TRUE(q && k && v);
      if (q == k && k == v) {
        EXPECT_EQ(scheme_of(lw.qkv), q);
      } else {
        ++mixed;
        EXPECT_TRUE(lw.qkv.w.empty());
        EXPECT_EQ(scheme_of(lw.q), q);
        EXPECT_EQ(scheme_of(lw.k), k);
        EXPECT_EQ(scheme_of(lw.v), v);
      }
      EXPECT_EQ(scheme_of(lw.mlp.down), expected(blk + "mlp.down_proj.weight"));
      EXPECT_EQ(scheme_of(lw.mlp.gate_up), expected(blk + "mlp.gate_proj.weight"));
    }
    EXPECT_GT(mixed, 0) << "the file has no layer of mixed q, k, v types";
    EXPECT_EQ(scheme_of(w.lm_head), expected("lm_head.weight"));
    // The untied embedding stays in its blocks, in the file's mapping (a row decoded per token).
    const TensorInfo* table = (*ckpt)->find("model.embed_tokens.weight");
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(w.embed_blocks, table->ggml_type);
    EXPECT_EQ(w.embed.dtype(), DType::kU8);
    EXPECT_EQ(static_cast<int64_t>(w.embed.nbytes()), static_cast<int64_t>(table->nbytes));
  }
}

// The table kept in its blocks streams like any unit beyond a weights budget: a quarter of
// the Q4_K_M file's weights resident gives every weight resident's tokens and logits, bit for
// bit, each way of bringing the units in.
TEST(GgufAutoQuantization, TheTableInItsBlocksStreamsBeyondABudget) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string path = testing::fixtures_dir() + "/gguf/gguf-llama-Q4_K_M.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "SKIPPED: no " << path;
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  GenerationRequest req;
  req.prompt = {1, 5, 9, 13, 200, 7};
  req.max_new_tokens = 8;
  auto run = [&](const std::string& budget, WeightStreaming streaming) -> StatusOr<GenerationResult> {
    ModelLoadOptions lo;
    lo.residency.budget = parse_weights_budget(budget).value();
    lo.residency.streaming = streaming;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::load(path, lo, **backend));
    EXPECT_GE(model->weights().embed_blocks, 0) << "the table was decoded";
    EXPECT_EQ(model->residency() != nullptr, budget != "all");
    if (model->residency() != nullptr) {
      EXPECT_NE(model->residency()->plan().find("per step (embedding table"), std::string::npos)
          << model->residency()->plan();
    }
    Generator gen(*model, **backend);
    TESSERA_ASSIGN_OR_RETURN(std::vector<GenerationResult> out, gen.generate({req}, true));
    return out[0];
  };
  auto resident = run("all", WeightStreaming::kRead);
  ASSERT_TRUE(resident.is_ok()) << resident.status().to_string();
  for (const WeightStreaming way : {WeightStreaming::kRead, WeightStreaming::kMap}) {
    auto streamed = run("25%", way);
    ASSERT_TRUE(streamed.is_ok()) << streamed.status().to_string();
    EXPECT_EQ(streamed->output, resident->output) << weight_streaming_name(way);
    EXPECT_EQ(streamed->logits, resident->logits) << weight_streaming_name(way);
  }
}

// auto on a Q8_0 file: its matrices (and LM head) become int8 with the blocks' own values and
// scales, nothing rounded again (the rows layout: what a device backend reads).
TEST(GgufAutoQuantization, Q8_0MatricesKeepTheirOwnInt8ValuesAndScales) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string path = testing::fixtures_dir() + "/gguf/kjv-llama-Q8_0.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << "SKIPPED: no " << path;
  auto ckpt = open_model_checkpoint(path);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto config = parse_model_config((*ckpt)->config(), (*ckpt)->config_source());
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  WeightLoadOptions o;
  o.quant.kind = WeightQuantization::kAuto;
  o.int8_layout = Int8WeightLayout::kRows;
  auto mw = load_model_weights(**ckpt, *config, o);
  ASSERT_TRUE(mw.is_ok()) << mw.status().to_string();
  // Every q8_0 block of the stored tensor against this rank's int8 rows [N, K] and scales.
  auto check = [&](const std::string& name, const LinearWeights& l) {
    SCOPED_TRACE(name);
    const TensorInfo* info = (*ckpt)->find(name);
    ASSERT_NE(info, nullptr);
    ASSERT_EQ(static_cast<GgmlType>(info->ggml_type), GgmlType::kQ8_0);
    ASSERT_EQ(l.w.dtype(), DType::kI8);
    const int64_t N = l.w.dim(0), K = l.w.dim(1), blocks = K / kGgmlQK;
    ASSERT_EQ(info->shape, (std::vector<int64_t>{N, K}));
    ASSERT_EQ(l.scales.dim(1), blocks);
    const auto* stored = static_cast<const uint8_t*>(info->data);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t b = 0; b < blocks; ++b) {
        const auto block = load_ggml_block<BlockQ8_0>(stored + n * blocks * int64_t{sizeof(BlockQ8_0)}, b);
        ASSERT_EQ(l.scales.data<float>()[n * blocks + b], f16_to_f32(block.d)) << "row " << n << " block " << b;
        ASSERT_EQ(std::memcmp(l.w.data<int8_t>() + n * K + b * kGgmlQK, block.qs, kGgmlQK), 0)
            << "row " << n << " block " << b;
      }
    }
  };
  check("model.layers.0.mlp.down_proj.weight", mw->layers[0].mlp.down);
  check("model.layers.1.self_attn.o_proj.weight", mw->layers[1].o);
  check("lm_head.weight", mw->lm_head);
  // A rule asking 4 bits of a q8_0 matrix gets them (from its floats), not its int8.
  QuantRuleConfig rule;
  rule.match = "down_proj";
  rule.quantize = WeightQuantization::kInt4;
  ASSERT_TRUE(compile_quant_rule_regex(&rule).is_ok());
  o.quant.rules.push_back(rule);
  auto ruled = load_model_weights(**ckpt, *config, o);
  ASSERT_TRUE(ruled.is_ok()) << ruled.status().to_string();
  EXPECT_EQ(int4_scheme_of(ruled->layers[0].mlp.down.w.view(), ruled->layers[0].mlp.down.scales.view()),
            Int4Scheme::kSymmetric);
  EXPECT_EQ(ruled->layers[0].o.w.dtype(), DType::kI8);
}

// The qwen3moe reader on a model the format can hold: tiny-qwen3-moe with its dense layer
// (mlp_only_layers [1]) replaced by a copy of layer 0's router and experts, written as a
// Hugging Face folder and compared with the GGUF file made from it.
TEST(GgufQwen3Moe, EveryLayerSparse) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-qwen3-moe";
  auto ckpt = Checkpoint::open(fixture);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  nlohmann::json config = (*ckpt)->config();
  std::vector<int64_t> dense = config["mlp_only_layers"].get<std::vector<int64_t>>();
  ASSERT_FALSE(dense.empty());
  config["mlp_only_layers"] = nlohmann::json::array();
  const std::string tmp = testing::make_temp_dir("tessera-gguf-qwen3moe");
  const std::string folder = tmp + "/as-all-sparse";
  fs::create_directories(folder);
  testing::write_file(folder + "/config.json", config.dump(2));
  // name in the new folder -> name in the fixture
  std::vector<std::pair<std::string, std::string>> names;
  auto is_dense = [&](const std::string& n) {
    for (int64_t l : dense)
      if (n.rfind("model.layers." + std::to_string(l) + ".mlp.", 0) == 0) return true;
    return false;
  };
  for (const std::string& n : (*ckpt)->tensor_names()) {
    if (is_dense(n)) continue;
    names.push_back({n, n});
    for (int64_t l : dense) {
      const std::string from = "model.layers.0.mlp.";
      if (n.rfind(from, 0) == 0) names.push_back({"model.layers." + std::to_string(l) + ".mlp." + n.substr(from.size()), n});
    }
  }
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [to, from] : names) entries.push_back({to, DType::kF32, (*ckpt)->find(from)->shape});
  auto writer = SafetensorsWriter::create(folder + "/model.safetensors", entries);
  ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
  for (const auto& [to, from] : names) {
    auto t = (*ckpt)->load(from, DType::kF32);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    ASSERT_TRUE((*writer)->write(to, t->data<char>(), t->nbytes()).is_ok());
  }
  ASSERT_TRUE((*writer)->finish().is_ok());
  // Its own numbers: no goldens (the fixture's are of the model with the dense layer).
  check_family_files("tiny-qwen3-moe-all-sparse", folder, fixture, false);
  fs::remove_all(tmp);
}

// tiny-llama's weights as a Granite checkpoint that computes the same function: embeddings
// times m, each sub-block's output times r with its output projection (o_proj, down_proj)
// times m / r, so the residual stream is m times Llama's; RMSNorm's epsilon times m^2, so
// every norm sees Llama's input; q_proj times 1 / (a sqrt(head_dim)) against the attention
// multiplier a; lm_head times s against logits_scaling s. A multiplier left out, or applied
// where Granite does not apply it, moves the logits off tiny-llama's goldens.
// MiniCPM (minicpm = true) the same way, with no attention multiplier (a = 1 / sqrt(head_dim)):
// scale_emb m, scale_depth r sqrt(layers), dim_model_base hidden / s.
std::string granite_from_llama(const std::string& fixture, const std::string& folder, bool minicpm = false) {
  const double m = 12.0, r = 0.22, s = 8.0;
  auto ckpt = Checkpoint::open(fixture);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  if (!ckpt.is_ok()) return "";
  nlohmann::json config = (*ckpt)->config();
  const double head_dim = config["hidden_size"].get<double>() / config["num_attention_heads"].get<double>();
  const double a = minicpm ? 1.0 / std::sqrt(head_dim) : 0.015625;
  config["model_type"] = minicpm ? "minicpm" : "granite";
  config["architectures"] = {minicpm ? "MiniCPMForCausalLM" : "GraniteForCausalLM"};
  config.erase("head_dim");
  config["rms_norm_eps"] = config["rms_norm_eps"].get<double>() * m * m;
  if (minicpm) {
    config["scale_emb"] = m;
    config["scale_depth"] = r * std::sqrt(config["num_hidden_layers"].get<double>());
    config["dim_model_base"] = config["hidden_size"].get<double>() / s;
  } else {
    config["embedding_multiplier"] = m;
    config["residual_multiplier"] = r;
    config["attention_multiplier"] = a;
    config["logits_scaling"] = s;
  }
  fs::create_directories(folder);
  testing::write_file(folder + "/config.json", config.dump(2));
  auto factor = [&](const std::string& name) {
    if (name.find("o_proj.") != std::string::npos || name.find("down_proj.") != std::string::npos) return m / r;
    if (name.find("q_proj.") != std::string::npos) return 1.0 / (a * std::sqrt(head_dim));
    if (name.rfind("lm_head.", 0) == 0) return s;
    return 1.0;
  };
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const std::string& name : (*ckpt)->tensor_names()) {
    auto t = (*ckpt)->load(name, DType::kF32);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    if (!t.is_ok()) return "";
    Tensor copy = Tensor::zeros(t->view().dims(), DType::kF32);
    const float f = static_cast<float>(factor(name));
    for (int64_t k = 0; k < t->numel(); ++k) copy.data<float>()[k] = t->data<float>()[k] * f;
    tensors.push_back(std::move(copy));
  }
  size_t k = 0;
  for (const std::string& name : (*ckpt)->tensor_names()) views.push_back({name, tensors[k++].view()});
  const Status st = write_safetensors(folder + "/model.safetensors", views);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return folder;
}

// Granite (3.x dense) from a folder and from the GGUF file llama.cpp's converter writes for it
// (granite.embedding_scale, residual_scale, attention.scale, logit_scale): both give
// tiny-llama's goldens on tiny-llama's weights rescaled as granite_from_llama says.
// The rescaled tiny-llama (granite_from_llama) from its folder, then check_family_files on it:
// both against tiny-llama's goldens. Returns the folder.
std::string check_rescaled_llama(const std::string& tmp, bool minicpm) {
  const std::string fixture = testing::fixtures_dir() + "/tiny-llama";
  const std::string name = minicpm ? "tiny-minicpm" : "tiny-granite";
  const std::string folder = granite_from_llama(fixture, tmp + "/" + name, minicpm);
  if (folder.empty()) return folder;
  const std::vector<FamilyCase> cases = family_goldens(fixture);
  auto run = run_family(folder, cases);
  EXPECT_TRUE(run.is_ok()) << run.status().to_string();
  if (!run.is_ok()) return folder;
  const float vs_goldens = difference_from_goldens(*run, cases);
  EXPECT_LE(vs_goldens, kGoldenBound);
  std::cout << "[ REPORT   ] " << name << " folder (tiny-llama rescaled): max |logit| diff vs goldens = " << vs_goldens
            << std::endl;
  check_family_files(name, folder, fixture, true);
  return folder;
}

TEST(GgufGranite, MultipliersGiveTheLlamaGoldensFromFolderAndFile) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string tmp = testing::make_temp_dir("tessera-granite");
  const std::string folder = check_rescaled_llama(tmp, /*minicpm=*/false);
  ASSERT_FALSE(folder.empty());
  const std::vector<FamilyCase> cases = family_goldens(testing::fixtures_dir() + "/tiny-llama");

  // A config that gives only logits_scaling: the file has no attention, embedding or residual
  // scale, which llama.cpp reads as 1/sqrt(head width), 1 and 1 (not the row's generated-model
  // values); the test converter lists the attention scale as lost, so the folder compared is
  // the one with 1/sqrt(head width).
  const std::string sparse = fixture_with_config(testing::fixtures_dir() + "/tiny-llama", tmp + "/granite-sparse",
                                                 {{"model_type", "granite"}, {"logits_scaling", 2.0}});
  check_family_files("tiny-granite-logits-scaling-only", sparse, testing::fixtures_dir() + "/tiny-llama", false);

  // A file whose rope.scaling.finetuned is false has no rotary positions in llama.cpp.
  auto conv = testing::gguf_from_hf(folder, GgufOutType::kF32);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  conv->writer.kv_bool("granite.rope.scaling.finetuned", false);
  auto refused = run_family(write_gguf(*conv, tmp, "no-rope"), cases);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("granite.rope.scaling.finetuned false"), std::string::npos)
      << refused.status().message();
  fs::remove_all(tmp);
}

// MiniCPM's scalings (scale_emb, scale_depth, dim_model_base) the same way: folder and file
// (minicpm.embedding_scale, residual_scale, logit_scale) give tiny-llama's goldens.
TEST(GgufMiniCpm, ScalingsGiveTheLlamaGoldensFromFolderAndFile) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string tmp = testing::make_temp_dir("tessera-minicpm");
  EXPECT_FALSE(check_rescaled_llama(tmp, /*minicpm=*/true).empty());
  fs::remove_all(tmp);
}

// SmolLM3's NoPE layers on tiny-llama's weights: with every layer rotating (no_rope_layers all
// 1) it is tiny-llama (the goldens); a NoPE layer changes the logits, and the interval rule
// puts it where the list does ((l + 1) % interval == 0: layer 2 of 3 for interval 3).
TEST(GgufSmolLM3, NoPeLayersFromTheListOrTheInterval) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-llama";
  const std::vector<FamilyCase> cases = family_goldens(fixture);
  const std::string tmp = testing::make_temp_dir("tessera-smollm3");
  auto run_with = [&](const std::string& name, nlohmann::json edits) {
    edits["model_type"] = "smollm3";
    edits["architectures"] = {"SmolLM3ForCausalLM"};
    return run_family(fixture_with_config(fixture, tmp + "/" + name, edits), cases);
  };
  auto all_rope = run_with("all-rope", {{"no_rope_layers", {1, 1, 1}}});
  auto listed = run_with("listed", {{"no_rope_layers", {1, 1, 0}}});
  auto interval = run_with("interval", {{"no_rope_layer_interval", 3}});
  ASSERT_TRUE(all_rope.is_ok() && listed.is_ok() && interval.is_ok())
      << all_rope.status().to_string() << " " << listed.status().to_string() << " " << interval.status().to_string();
  const float vs_goldens = difference_from_goldens(*all_rope, cases);
  EXPECT_LE(vs_goldens, kGoldenBound);
  const float nope_effect = largest_logit_difference(*listed, *all_rope);
  EXPECT_GT(nope_effect, 1e-2f) << "a NoPE layer gave the logits of a rotating one";
  const float list_vs_interval = compare_runs(*interval, *listed, "interval 3 vs no_rope_layers [1, 1, 0]");
  EXPECT_EQ(list_vs_interval, 0.0f);
  std::cout << "[ REPORT   ] smollm3: all layers rotating vs goldens " << vs_goldens << ", one NoPE layer moves the logits by "
            << nope_effect << ", interval vs list " << list_vs_interval << std::endl;
  fs::remove_all(tmp);
}

// The GGUF file of a 4-layer SmolLM3 (tiny-llama's layers and a copy of its layer 0 as layer 3,
// which llama.cpp's loader, as SmolLM3Config by default, leaves without positions) gives the
// folder's logits.
TEST(GgufSmolLM3, FourLayerFileReadsBackAsTheFolder) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixture = testing::fixtures_dir() + "/tiny-llama";
  auto ckpt = Checkpoint::open(fixture);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  nlohmann::json config = (*ckpt)->config();
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  config["num_hidden_layers"] = layers + 1;
  config["model_type"] = "smollm3";
  config["architectures"] = {"SmolLM3ForCausalLM"};
  const std::string tmp = testing::make_temp_dir("tessera-smollm3-gguf");
  const std::string folder = tmp + "/four-layers";
  fs::create_directories(folder);
  testing::write_file(folder + "/config.json", config.dump(2));
  std::vector<std::pair<std::string, std::string>> names;  // name in the new folder -> in the fixture
  const std::string first = "model.layers.0.", added = "model.layers." + std::to_string(layers) + ".";
  for (const std::string& n : (*ckpt)->tensor_names()) {
    names.push_back({n, n});
    if (n.rfind(first, 0) == 0) names.push_back({added + n.substr(first.size()), n});
  }
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [to, from] : names) {
    auto t = (*ckpt)->load(from, DType::kF32);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tensors.push_back(std::move(t).value());
  }
  for (size_t k = 0; k < names.size(); ++k) views.push_back({names[k].first, tensors[k].view()});
  ASSERT_TRUE(write_safetensors(folder + "/model.safetensors", views).is_ok());
  check_family_files("smollm3-four-layers", folder, fixture, false);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace tessera
