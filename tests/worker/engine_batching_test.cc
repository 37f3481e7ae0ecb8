// Continuous batching must not change any sequence's tokens: the fixture prompts run
// together through Engine + Scheduler + Executor, arriving at different steps, with
// chunked prefill forced small and with a KV pool too small for all of them (preemption
// by recompute), and each must still produce the reference's greedy ids.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>

#include "coordinator/engine.h"
#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

struct Case {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

std::vector<Case> read_cases(const std::string& dir) {
  std::ifstream in(dir + "/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& c : index["cases"]) {
    cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>()});
  }
  return cases;
}

struct RunStats {
  uint64_t preemptions = 0;
  uint64_t steps = 0;
};

// Adds request i at step i * `stagger`, runs to completion, returns each request's output.
std::vector<std::vector<int32_t>> run_engine(Transformer& model, Backend& backend, const std::vector<Case>& cases,
                                             SchedulerConfig sc, int stagger, const SamplingParams& sampling,
                                             RunStats* stats) {
  Executor executor(model, backend, sc.block_size, sc.num_blocks, model.dtype());
  Engine engine(sc, executor);
  std::map<SeqId, size_t> index_of;
  std::vector<std::vector<int32_t>> outputs(cases.size());
  size_t next = 0;
  for (uint64_t step = 0; next < cases.size() || engine.has_work(); ++step) {
    while (next < cases.size() && step >= next * static_cast<uint64_t>(stagger)) {
      EngineRequest r;
      r.prompt = cases[next].prompt;
      r.max_new_tokens = static_cast<int>(cases[next].greedy.size());
      r.sampling = sampling;
      r.stop.ignore_eos = true;
      auto id = engine.add_request(r);
      EXPECT_TRUE(id.is_ok()) << id.status().to_string();
      if (!id.is_ok()) return outputs;
      index_of[id.value()] = next++;
    }
    for (const SequenceEvent& ev : engine.step()) {
      EXPECT_NE(ev.reason, FinishReason::kError) << ev.error;
      for (const SampledToken& t : ev.new_tokens) outputs[index_of[ev.seq_id]].push_back(t.token);
    }
    EXPECT_LT(step, 100000u) << "engine did not finish";
    if (step >= 100000u) break;
  }
  if (stats) {
    stats->preemptions = engine.scheduler().stats().num_preemptions;
    stats->steps = engine.steps();
  }
  return outputs;
}

class EngineBatchingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto b = make_backend("cpu");
    ASSERT_TRUE(b.is_ok());
    backend_ = std::move(b).value();
    auto m = Transformer::load(testing::fixtures_dir() + "/" + GetParam(), ModelLoadOptions{}, *backend_);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(m).value();
    cases_ = read_cases(testing::fixtures_dir() + "/" + GetParam());
  }

  int blocks_for_all(int block_size) const {
    int n = 0;
    for (const Case& c : cases_) n += static_cast<int>((c.prompt.size() + c.greedy.size() + block_size - 1) / block_size);
    return n;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> model_;
  std::vector<Case> cases_;
};

TEST_P(EngineBatchingTest, StaggeredArrivalsWithSmallPrefillChunksMatchTheReference) {
  SchedulerConfig sc;
  sc.block_size = 4;
  sc.num_blocks = blocks_for_all(sc.block_size);
  sc.max_num_batched_tokens = 8;  // every prompt longer than 8 is prefilled in chunks
  sc.max_model_len = 4096;
  auto out = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/3, SamplingParams{}, nullptr);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(out[i], cases_[i].greedy) << "case " << i;
}

TEST_P(EngineBatchingTest, PreemptionByRecomputeMatchesTheReference) {
  SchedulerConfig sc;
  sc.block_size = 4;
  // Room for the longest sequence plus a little: the rest must wait or be preempted.
  int longest = 0;
  for (const Case& c : cases_) longest = std::max<int>(longest, static_cast<int>((c.prompt.size() + c.greedy.size() + 3) / 4));
  sc.num_blocks = longest + 4;
  sc.max_num_batched_tokens = 16;
  sc.max_model_len = 4096;
  RunStats stats;
  auto out = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/0, SamplingParams{}, &stats);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(out[i], cases_[i].greedy) << "case " << i;
  EXPECT_GT(stats.preemptions, 0u) << "the pool was meant to force preemption";
  std::cout << "[ REPORT   ] " << GetParam() << ": " << stats.preemptions << " preemptions in " << stats.steps
            << " steps" << std::endl;
}

TEST_P(EngineBatchingTest, SeededSamplingIsTheSameAloneAndInABatch) {
  SamplingParams sampling;
  sampling.temperature = 0.9f;
  sampling.top_p = 0.95f;
  sampling.top_k = 50;
  sampling.seed = 1234;
  SchedulerConfig sc;
  sc.block_size = 8;
  sc.num_blocks = blocks_for_all(sc.block_size);
  sc.max_num_batched_tokens = 32;
  sc.max_model_len = 4096;
  auto together = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/2, sampling, nullptr);
  for (size_t i = 0; i < cases_.size(); ++i) {
    auto alone = run_engine(*model_, *backend_, {cases_[i]}, sc, 0, sampling, nullptr);
    EXPECT_EQ(alone[0], together[i]) << "case " << i;
  }
  // Sampling really happened: at least one sequence left the greedy path.
  bool differs = false;
  for (size_t i = 0; i < cases_.size(); ++i) differs |= together[i] != cases_[i].greedy;
  EXPECT_TRUE(differs);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineBatchingTest,
                         ::testing::Values("tiny-bloom", "tiny-llama", "tiny-mixtral", "kjv-llama"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace tessera
