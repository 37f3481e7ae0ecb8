// Int8 weights against the fixture goldens (../shared/fixtures/README.md section 2), as the
// issue states the bar: measure the int8 logit error against the reference logits, then the
// greedy tokens must match on every leading row whose reference top-1/top-2 gap exceeds
// twice that error (each of the two logits moves by at most the error, so such a row
// cannot flip). The counts are printed for docs/quantization.md. Also every tiny model of
// the fixtures loads and runs with int8 weights, within a bound of its f32 logits.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iostream>

#include "common/config.h"
#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/generator.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

struct Int8Golden {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits;
};

std::vector<Int8Golden> int8_goldens(const std::string& dir) {
  std::ifstream in(dir + "/goldens/index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  std::vector<Int8Golden> out;
  for (const auto& c : index["cases"]) {
    out.push_back({c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>(),
                   testing::read_f32_file(dir + "/goldens/" + c["logits_file"].get<std::string>())});
  }
  return out;
}

StatusOr<std::vector<GenerationResult>> run_goldens(const std::string& dir, const QuantizationOptions& q,
                                                    const std::vector<Int8Golden>& cases, Backend& backend) {
  ModelLoadOptions lo;
  lo.dtype = DType::kF32;
  lo.quant = q;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::load(dir, lo, backend));
  Generator gen(*model, backend);
  std::vector<GenerationRequest> reqs;
  for (const Int8Golden& c : cases) {
    GenerationRequest r;
    r.prompt = c.prompt;
    r.max_new_tokens = static_cast<int>(c.greedy.size());
    reqs.push_back(r);
  }
  return gen.generate(reqs, /*keep_logits=*/true);
}

TEST(QuantizedGoldenTest, KjvLlamaInt8MatchesGreedyTokensWhereTheGapExceedsTheMeasuredError) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/kjv-llama";
  const std::vector<Int8Golden> cases = int8_goldens(dir);
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  for (int group : {32, 64}) {
    QuantizationOptions q;
    q.kind = WeightQuantization::kInt8;
    q.group = group;
    auto results = run_goldens(dir, q, cases, *backend.value());
    ASSERT_TRUE(results.is_ok()) << results.status().to_string();
    const int64_t vocab = static_cast<int64_t>(cases[0].logits.size() / cases[0].greedy.size());
    // The error: over every row computed on the reference's own context (rows up to and
    // including the first token that differs).
    float error = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const GenerationResult& r = results.value()[i];
      for (size_t s = 0; s < cases[i].greedy.size(); ++s) {
        for (int64_t v = 0; v < vocab; ++v)
          error = std::max(error, std::fabs(r.logits[s * vocab + v] - cases[i].logits[s * vocab + v]));
        if (r.output[s] != cases[i].greedy[s]) break;
      }
    }
    EXPECT_LT(error, 0.25f) << "group " << group;
    int rows = 0, trusted = 0, matched_trusted = 0, matched = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const GenerationResult& r = results.value()[i];
      bool leading = true, same = true;
      for (size_t s = 0; s < cases[i].greedy.size(); ++s) {
        ++rows;
        same = same && r.output[s] == cases[i].greedy[s];
        if (same) ++matched;
        leading = leading && testing::top2_margin(&cases[i].logits[s * vocab], vocab) > 2 * error;
        if (!leading) continue;
        ++trusted;
        EXPECT_EQ(r.output[s], cases[i].greedy[s]) << "group " << group << " case " << i << " row " << s;
        if (r.output[s] == cases[i].greedy[s]) ++matched_trusted;
      }
    }
    std::cout << "kjv-llama int8 group " << group << ": max logit error " << error << "; " << trusted << " of " << rows
              << " leading rows have a reference gap > 2x that, " << matched_trusted << " of them match; "
              << matched << " of " << rows << " rows match before the first divergence\n";
  }
}

// Every tiny fixture model with quantized weights (`q`; a rule keeps an input dimension the
// group does not divide in the compute dtype): the largest row-0 logit error against the
// f32 references and their largest |logit|, per model; fails the test on a load error.
std::vector<std::pair<float, float>> tiny_family_errors(QuantizationOptions q, const char* refusal) {
  std::vector<std::pair<float, float>> out;
  auto backend = make_backend("cpu");
  EXPECT_TRUE(backend.is_ok());
  if (!backend.is_ok()) return out;
  for (const std::string& name : testing::tiny_models()) {
    const std::string dir = testing::fixtures_dir() + "/" + name;
    const std::vector<Int8Golden> cases = int8_goldens(dir);
    QuantizationOptions qm = q;
    auto results = run_goldens(dir, qm, cases, *backend.value());
    if (!results.is_ok() && results.status().message().find(refusal) != std::string::npos) {
      // tiny-llama's MLP is 344 wide, tiny-qwen3-moe's experts 48: keep those down projections.
      QuantRuleConfig keep;
      keep.match = "down_proj";
      keep.quantize = WeightQuantization::kNone;
      EXPECT_TRUE(compile_quant_rule_regex(&keep).is_ok());
      qm.rules.push_back(keep);
      results = run_goldens(dir, qm, cases, *backend.value());
    }
    EXPECT_TRUE(results.is_ok()) << name << ": " << results.status().to_string();
    if (!results.is_ok()) return out;
    const int64_t vocab = static_cast<int64_t>(cases[0].logits.size() / cases[0].greedy.size());
    float error = 0, scale = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      for (int64_t v = 0; v < vocab; ++v) {  // row 0: the prompt alone, the same context for both
        error = std::max(error, std::fabs(results.value()[i].logits[v] - cases[i].logits[v]));
        scale = std::max(scale, std::fabs(cases[i].logits[v]));
      }
    }
    std::cout << name << " " << weight_quantization_name(q.kind) << ": row-0 logit error " << error
              << " (logits up to " << scale << ")\n";
    out.push_back({error, scale});
  }
  return out;
}

// The LM head's default: under int4 int8 where it has its own matrix (kjv-llama), the compute
// dtype where a rule says `none` and where it is the embedding (tiny-llama3 ties them); under
// int8 and none the compute dtype.
TEST(QuantizedGoldenTest, AnUntiedLmHeadIsInt8UnderInt4UnlessARuleKeepsIt) {
  TESSERA_REQUIRE_FIXTURES();
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  auto head_dtype = [&](const std::string& model, WeightQuantization kind, bool keep_rule) -> DType {
    ModelLoadOptions lo;
    lo.dtype = DType::kF32;
    lo.quant.kind = kind;
    if (keep_rule) {
      QuantRuleConfig r;
      r.match = "^lm_head\\.";
      r.quantize = WeightQuantization::kNone;
      EXPECT_TRUE(compile_quant_rule_regex(&r).is_ok());
      lo.quant.rules.push_back(r);
    }
    auto loaded = Transformer::load(testing::fixtures_dir() + "/" + model, lo, **backend);
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    return loaded.is_ok() ? (*loaded)->weights().lm_head.w.dtype() : DType::kU8;
  };
  EXPECT_EQ(head_dtype("kjv-llama", WeightQuantization::kInt4, false), DType::kI8);
  EXPECT_EQ(head_dtype("kjv-llama", WeightQuantization::kInt4, true), DType::kF32);
  EXPECT_EQ(head_dtype("tiny-llama3", WeightQuantization::kInt4, false), DType::kF32);
  EXPECT_EQ(head_dtype("kjv-llama", WeightQuantization::kInt8, false), DType::kF32);
  EXPECT_EQ(head_dtype("kjv-llama", WeightQuantization::kNone, false), DType::kF32);
}

// Every tiny fixture model runs int8 (group 32), its logits near the f32 ones.
TEST(QuantizedGoldenTest, EveryTinyFamilyRunsWithInt8Weights) {
  TESSERA_REQUIRE_FIXTURES();
  QuantizationOptions q;
  q.kind = WeightQuantization::kInt8;
  q.group = 32;
  for (const auto& [error, scale] : tiny_family_errors(q, "does not divide")) EXPECT_LT(error, 0.05f * scale + 0.05f);
}

// And with 4-bit weights (q4_0's rule, groups of 32): every family's linears, MoE experts and
// shared experts included, through the 4-bit kernels. The tiny models' random weights make
// rounding show: a 4-bit step is ~17x an int8 step of the same group (a range of 15 levels
// against 254), and the measured errors are 7-27x int8's (0.6-4.2 against logits up to 6.9).
// So: more than int8's error (4 bits really ran) and under 40x it (no misplaced weight, which
// would be as large as the logits themselves).
TEST(QuantizedGoldenTest, EveryTinyFamilyRunsWithInt4Weights) {
  TESSERA_REQUIRE_FIXTURES();
  QuantizationOptions q8;
  q8.kind = WeightQuantization::kInt8;
  q8.group = 32;
  QuantizationOptions q4;
  q4.kind = WeightQuantization::kInt4;
  const auto int8 = tiny_family_errors(q8, "does not divide");
  const auto int4 = tiny_family_errors(q4, "not a multiple of 32");
  ASSERT_EQ(int8.size(), int4.size());
  for (size_t i = 0; i < int4.size(); ++i) {
    EXPECT_GT(int4[i].first, int8[i].first) << testing::tiny_models()[i];
    EXPECT_LT(int4[i].first, 40.0f * int8[i].first) << testing::tiny_models()[i];
  }
}

}  // namespace
}  // namespace tessera
