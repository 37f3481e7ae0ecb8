// The start-up warm-up (coordinator/engine/engine_warm_up.h) on the real kjv-llama model and the
// real executor: it runs the longest prefill the config allows and a small decode batch, feeds
// exactly those tokens, leaves no sequence state behind on the executor, fits a tiny KV pool, and a
// request served after it gets the same greedy tokens as on a fresh executor.
#include "coordinator/engine/engine_warm_up.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "coordinator/engine/engine.h"
#include "coordinator/engine/request.h"
#include "kernels/backend.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

class EngineWarmUpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::fixtures_dir().empty()) GTEST_SKIP() << "SKIPPED: ../shared/fixtures not found";
    auto b = make_backend("cpu");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    backend_ = std::move(b).value();
    auto m = Transformer::load(testing::fixtures_dir() + "/kjv-llama", ModelLoadOptions{}, *backend_);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(m).value();
  }

  SchedulerConfig config(int num_blocks) const {
    SchedulerConfig c;
    c.block_size = 16;
    c.num_blocks = num_blocks;
    c.max_model_len = 256;
    c.max_num_batched_tokens = 128;
    c.max_num_seqs = 4;
    return c;
  }

  // Greedy tokens of one 40-token prompt served by a fresh engine on `executor`.
  std::vector<int32_t> serve_one(StepExecutor& executor, const SchedulerConfig& c) {
    std::vector<int32_t> prompt(40);
    for (int i = 0; i < 40; ++i) prompt[static_cast<size_t>(i)] = 3 + (i * 53 + 5) % 1000;
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    StopConditions stop;
    stop.ignore_eos = true;
    Engine engine(c, executor);
    EXPECT_TRUE(engine.add_request(1, make_request(prompt, 10, greedy, stop)).is_ok());
    std::vector<int32_t> out;
    while (engine.has_work()) {
      for (const SequenceEvent& e : engine.step()) {
        EXPECT_NE(e.reason, FinishReason::kError) << e.error;
        for (const SampledToken& t : e.new_tokens) out.push_back(t.token);
      }
    }
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> model_;
};

TEST_F(EngineWarmUpTest, RunsTheLongestChunkAndADecodeBatchAndLeavesNothingBehind) {
  const SchedulerConfig c = config(64);
  Executor executor(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
  testing::ScriptedExecutor counting(executor);  // passes plans to the model, counting what they feed
  StatusOr<WarmUpReport> report = warm_up_executor(c, counting, model_->config().vocab);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->prompt_tokens, 128);  // the token budget (under max_model_len and the pool)
  EXPECT_EQ(report->decode_batch, 4);     // max_num_seqs
  // The long prompt, its one decode step (2 tokens generated); one prompt of 4 tokens alone,
  // then 4 together, and their two decode steps each (3 tokens generated).
  EXPECT_EQ(counting.fed(), 128 + 1 + 5 * (4 + 2));
  EXPECT_GE(report->steps, 4);
  EXPECT_EQ(executor.sequences().size(), 0u);

  Executor fresh(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
  const std::vector<int32_t> want = serve_one(fresh, c);
  EXPECT_EQ(want.size(), 10u);
  EXPECT_EQ(serve_one(executor, c), want);
}

TEST_F(EngineWarmUpTest, FitsATinyKvPool) {
  const SchedulerConfig c = config(4);  // 64 tokens of KV in all
  Executor executor(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
  StatusOr<WarmUpReport> report = warm_up_executor(c, executor, model_->config().vocab);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_LE(report->prompt_tokens + 2, 4 * 16);
  EXPECT_GE(report->prompt_tokens, 1);
  EXPECT_EQ(executor.sequences().size(), 0u);
}

// A server warms up while it takes requests: the warm-up asks before each step whether to
// stop, and stopped midway it still leaves no sequence behind, so a request served next gets a
// fresh executor's tokens.
TEST_F(EngineWarmUpTest, CutShortItStopsBeforeTheNextStepAndLeavesNothingBehind) {
  const SchedulerConfig c = config(64);
  for (int allowed : {0, 1, 3, 4}) {
    Executor executor(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
    testing::ScriptedExecutor counting(executor);
    int asked = 0;
    StatusOr<WarmUpReport> report =
        warm_up_executor(c, counting, model_->config().vocab, Pooling::kNone, [&] { return asked++ >= allowed; });
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_TRUE(report->cut_short) << allowed;
    EXPECT_EQ(report->steps, allowed);
    EXPECT_EQ(report->prompt_tokens, 0) << "the long prefill comes last";
    // Steps 1..3 are the lone short request's prefill and its two decode steps (a first
    // request's steps, so one arriving meanwhile waits the least); none ran at 0.
    // Step 4 is the short batch's prefill.
    const std::map<int, int> fed = {{0, 0}, {1, 4}, {3, 4 + 2}, {4, 4 + 2 + 4 * 4}};
    EXPECT_EQ(counting.fed(), fed.at(allowed)) << allowed;
    EXPECT_EQ(executor.sequences().size(), 0u) << allowed;
    Executor fresh(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
    EXPECT_EQ(serve_one(executor, c), serve_one(fresh, c)) << allowed;
  }
}

TEST_F(EngineWarmUpTest, NeverCutShortItRunsToItsEnd) {
  const SchedulerConfig c = config(64);
  Executor executor(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
  StatusOr<WarmUpReport> report =
      warm_up_executor(c, executor, model_->config().vocab, Pooling::kNone, [] { return false; });
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_FALSE(report->cut_short);
  EXPECT_EQ(report->prompt_tokens, 128);
  EXPECT_EQ(report->decode_batch, 4);
}

// The step-cost curve speculative decoding's back-off reads: plain steps of 1, 2, 4, ... rows
// (up to the token budget, 128 here, unless a step takes 4x a one-row step's first), each
// timed five times (the times themselves are the host's); nothing is left on the executor, and a
// request served after it gets the fresh executor's tokens.
TEST_F(EngineWarmUpTest, MeasuresAStepsTimeByItsRowsAndLeavesNothingBehind) {
  SchedulerConfig c = config(64);
  c.speculative.method = SpeculativeConfig::Method::kNgram;
  Executor executor(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
  testing::ScriptedExecutor counting(executor);
  StatusOr<RowCostCurve> curve = measure_row_costs(c, counting, model_->config().vocab);
  ASSERT_TRUE(curve.is_ok()) << curve.status().to_string();
  const auto& measured = curve->measured();
  ASSERT_GE(measured.size(), 2u) << curve->describe();
  int64_t fed = 0;
  for (size_t i = 0; i < measured.size(); ++i) {
    EXPECT_EQ(measured[i].first, 1 << i) << curve->describe();
    EXPECT_GT(measured[i].second, 0.0) << curve->describe();
    fed += 5 * measured[i].first;
  }
  EXPECT_LE(measured.back().first, 128);
  EXPECT_EQ(counting.fed(), fed);  // each size five times, one prompt step each
  EXPECT_EQ(executor.sequences().size(), 0u);
  Executor fresh(*model_, *backend_, c.block_size, c.num_blocks, model_->dtype());
  EXPECT_EQ(serve_one(executor, c), serve_one(fresh, c));
}

}  // namespace
}  // namespace tessera
