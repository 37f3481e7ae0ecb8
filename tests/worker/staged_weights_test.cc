// Weights streamed into device slots (worker/staged_weights.h), run on the CPU backend with
// its host stager (kernels/weight_stager.h) — the bookkeeping the CUDA backend runs with
// pinned memory and a copy stream (its goldens: FixturesCuda/GoldenTest.*_staged, run by
// tests/gpu/run.sh). kjv-llama's logits with a quarter resident equal every weight resident's,
// bit for bit, for each prefetch depth and with int8 weights; units still in their slots are
// not copied again; a step that skips the LM head leaves no slot held.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "tests/worker/golden_model_fixture.h"
#include "worker/generator.h"
#include "worker/kv_cache.h"
#include "worker/transformer.h"

namespace tessera {
// Named, not anonymous: a unity build may compile this file beside another test file with
// helpers of the same names.
namespace staged_weights_test {

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> model;
};

Loaded load(const std::string& model, const std::string& budget, int prefetch = 2,
            WeightQuantization quant = WeightQuantization::kNone) {
  Loaded l;
  l.backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}}).value();
  ModelLoadOptions lo;
  lo.quant.kind = quant;
  lo.residency.budget = parse_weights_budget(budget).value();
  lo.residency.prefetch_layers = prefetch;
  lo.residency.device_slots = true;
  auto m = Transformer::load(testing::fixtures_dir() + "/" + model, lo, *l.backend);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (m.is_ok()) l.model = std::move(m).value();
  return l;
}

std::vector<GenerationRequest> golden_requests(const std::string& model) {
  return testing::golden_generation_requests(testing::fixtures_dir() + "/" + model);
}

std::vector<GenerationResult> generate(Loaded& l, const std::vector<GenerationRequest>& reqs) {
  Generator gen(*l.model, *l.backend);
  auto out = gen.generate(reqs, /*keep_logits=*/true);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? std::move(out).value() : std::vector<GenerationResult>{};
}

class StagedWeightsTest : public ::testing::TestWithParam<int> {};  // prefetch depth

TEST_P(StagedWeightsTest, AQuarterResidentGivesTheLogitsOfEveryWeightResident) {
  TESSERA_REQUIRE_FIXTURES();
  const std::vector<GenerationRequest> reqs = golden_requests("kjv-llama");
  Loaded resident = load("kjv-llama", "all");
  ASSERT_TRUE(resident.model);
  EXPECT_EQ(resident.model->staged(), nullptr);
  const std::vector<GenerationResult> want = generate(resident, reqs);

  Loaded staged = load("kjv-llama", "25%", GetParam());
  ASSERT_TRUE(staged.model);
  const StagedWeights* s = staged.model->staged();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(staged.model->residency(), nullptr) << "staged, not spilled";
  std::cout << "[ REPORT   ] " << s->plan() << std::endl;
  const std::vector<GenerationResult> got = generate(staged, reqs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].output, want[i].output) << "case " << i;
    EXPECT_EQ(got[i].logits, want[i].logits) << "case " << i << ": the same weights, only copied into slots";
  }
  // What the device holds: the resident set within the budget, plus the slots.
  EXPECT_LE(s->device_bytes() - s->slots_bytes(), s->budget_bytes());
  EXPECT_EQ(s->slots_bytes(), GetParam() * s->slot_bytes());
  EXPECT_LT(s->device_bytes(), staged.model->weights().total_bytes);
  EXPECT_GT(s->copies(), 0);
}

INSTANTIATE_TEST_SUITE_P(Prefetch, StagedWeightsTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "depth" + std::to_string(i.param); });

// Int8 weights (the CPU's panels with their scales) streamed give the logits of int8 resident.
TEST(StagedWeights, Int8WeightsStagedGiveTheLogitsOfInt8Resident) {
  TESSERA_REQUIRE_FIXTURES();
  const std::vector<GenerationRequest> reqs = golden_requests("kjv-llama");
  Loaded resident = load("kjv-llama", "all", 2, WeightQuantization::kInt8);
  Loaded staged = load("kjv-llama", "25%", 2, WeightQuantization::kInt8);
  ASSERT_TRUE(resident.model && staged.model);
  ASSERT_NE(staged.model->staged(), nullptr);
  std::cout << "[ REPORT   ] " << staged.model->staged()->plan() << std::endl;
  const std::vector<GenerationResult> want = generate(resident, reqs), got = generate(staged, reqs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].logits, want[i].logits) << "case " << i;
}

// With as many slots as streamed units, each unit is copied once and stays: later steps copy
// nothing. (kjv-llama with all but a few units resident.)
TEST(StagedWeights, UnitsStillInTheirSlotsAreNotCopiedAgain) {
  TESSERA_REQUIRE_FIXTURES();
  // 90%: the LM head and most layers stay; the embedding table and the last layers stream.
  Loaded staged = load("kjv-llama", "90%", /*prefetch=*/8);
  ASSERT_TRUE(staged.model);
  const StagedWeights* s = staged.model->staged();
  ASSERT_NE(s, nullptr);
  const int64_t slots = s->slots_bytes() / s->slot_bytes();
  ASSERT_LT(slots, 8) << "more streamed units than slots: " << s->plan();
  std::vector<GenerationRequest> reqs = golden_requests("kjv-llama");
  reqs = {reqs.back()};
  ASSERT_FALSE(reqs[0].prompt.empty());
  generate(staged, reqs);
  EXPECT_EQ(s->copies(), slots) << "each streamed unit once: " << s->plan();
  generate(staged, reqs);
  EXPECT_EQ(s->copies(), slots) << "nothing copied again";
}

// A prefill chunk asks for no logits: the step skips the LM head that the last layer read
// ahead. The next step still finds a slot for each unit it streams, and the same logits.
std::vector<float> chunked_prefill_logits(Loaded& l, const std::vector<int32_t>& prompt, size_t first_chunk) {
  const ModelConfig& config = l.model->config();
  const int block_size = 16;
  const int blocks = static_cast<int>((prompt.size() + block_size - 1) / block_size);
  KvCache cache(config, block_size, blocks, DType::kF32, *l.backend);
  Tensor logits = l.backend->alloc({1, config.vocab}, DType::kF32);
  for (size_t begin = 0; begin < prompt.size();) {
    const size_t end = begin == 0 ? first_chunk : prompt.size();
    AttentionBatch batch;
    batch.query_start = {0, static_cast<int32_t>(end - begin)};
    batch.context_lens = {static_cast<int32_t>(end)};
    batch.max_blocks_per_seq = blocks;
    for (int b = 0; b < blocks; ++b) batch.block_tables.push_back(b);
    for (size_t t = begin; t < end; ++t) batch.slot_mapping.push_back(static_cast<int32_t>(t));
    const std::vector<int32_t> tokens(prompt.begin() + static_cast<std::ptrdiff_t>(begin),
                                      prompt.begin() + static_cast<std::ptrdiff_t>(end));
    // Logits of the last token only, and none for the first chunk.
    const std::vector<int32_t> rows =
        end == prompt.size() ? std::vector<int32_t>{static_cast<int32_t>(end - begin - 1)} : std::vector<int32_t>{};
    EXPECT_TRUE(l.model->forward(tokens, batch, cache, rows, logits.view()).is_ok());
    begin = end;
  }
  std::vector<float> out(static_cast<size_t>(config.vocab));
  l.backend->copy_to_host(logits.view(), out.data());
  return out;
}

TEST(StagedWeights, AStepWithoutTheLmHeadLeavesNoSlotHeld) {
  TESSERA_REQUIRE_FIXTURES();
  Loaded resident = load("kjv-llama", "all");
  Loaded staged = load("kjv-llama", "10%", /*prefetch=*/2);
  ASSERT_TRUE(resident.model && staged.model);
  ASSERT_NE(staged.model->staged(), nullptr);
  std::vector<int32_t> prompt = golden_requests("kjv-llama").back().prompt;
  ASSERT_FALSE(prompt.empty());
  while (prompt.size() < 24) prompt.push_back(prompt[prompt.size() % 4]);
  EXPECT_EQ(chunked_prefill_logits(staged, prompt, 8), chunked_prefill_logits(resident, prompt, 8));
}

// What a device does not use is refused, naming the key, instead of being ignored.
TEST(StagedWeights, ASpillOrCacheFolderOrAWayOfReadingThemIsRefusedForADevice) {
  WeightResidencyOptions o;
  o.budget = parse_weights_budget("25%").value();
  EXPECT_TRUE(check_device_streaming_options(o).is_ok());
  o.spill_dir = "/var/tmp";
  const Status dir = check_device_streaming_options(o);
  EXPECT_NE(dir.message().find("model.weights_spill_dir '/var/tmp'"), std::string::npos) << dir.to_string();
  o.spill_dir.clear();
  o.cache_dir = "/var/tmp/tessera-cache";
  const Status cache = check_device_streaming_options(o);
  EXPECT_NE(cache.message().find("model.weights_cache_dir '/var/tmp/tessera-cache'"), std::string::npos)
      << cache.to_string();
  o.cache_dir.clear();
  o.streaming = WeightStreaming::kDirect;
  const Status way = check_device_streaming_options(o);
  EXPECT_NE(way.message().find("model.weights_streaming direct"), std::string::npos) << way.to_string();
}

// Coded bf16 weights stream from the CPU backend's spill file, not into device buffers:
// asked for with units streamed into them, the load is refused in one line.
TEST(StagedWeights, CodedBf16IntoDeviceBuffersIsRefusedNamingTheKey) {
  TESSERA_REQUIRE_FIXTURES();
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  ModelLoadOptions lo;
  lo.dtype = DType::kBF16;
  lo.quant.bf16_coding = Bf16Coding::kOn;
  lo.residency.budget = parse_weights_budget("25%").value();
  lo.residency.device_slots = true;
  auto m = Transformer::load(testing::fixtures_dir() + "/tiny-llama", lo, **backend);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("model.bf16_coding on: coded weights are streamed on the CPU backend only"),
            std::string::npos)
      << m.status().to_string();
  EXPECT_EQ(m.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace tessera
