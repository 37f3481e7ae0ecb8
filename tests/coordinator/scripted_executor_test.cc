// The scripted executor (tests/scripted_executor.h) does what the engine and server tests
// rely on: tokens by script (per prompt, then the default), top logprobs, failures and their
// messages, counts, and a refused plan or a missing first prompt token reported as a test
// failure, not only as the step's error.
#include "tests/scripted_executor.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <vector>

namespace tessera {
namespace {

using testing::ScriptedExecutor;

// A sampling step of sequence `id`; version 1 starts it (2 top logprobs asked).
SeqStep scripted_step(SeqId id, uint32_t version, std::vector<int32_t> tokens, int32_t num_computed) {
  SeqStep s;
  s.seq_id = id;
  s.version = version;
  s.tokens = std::move(tokens);
  s.num_computed = num_computed;
  s.sample = true;
  s.table_from = version == 1 ? 0 : 1;  // one block, block 0, sent on the starting step
  if (version == 1) {
    s.new_blocks = {0};
    s.start.emplace();
    s.start->prompt_len = num_computed + static_cast<int32_t>(s.tokens.size());
    s.start->sampling.logprobs = 2;
  }
  return s;
}

StepPlan scripted_plan(uint64_t step_id, std::vector<SeqStep> seqs) {
  StepPlan p;
  p.step_id = step_id;
  p.seqs = std::move(seqs);
  return p;
}

std::vector<int32_t> scripted_tokens(const StatusOr<StepResult>& r) {
  std::vector<int32_t> out;
  if (r.is_ok())
    for (const SampledToken& t : r->tokens) out.push_back(t.token);
  return out;
}

TEST(ScriptedExecutorTest, PerPromptScriptsThenTheTokenScriptWithTopLogprobs) {
  ScriptedExecutor exec;  // by_index()
  exec.script(7, {40, 41});
  StatusOr<StepResult> r = exec.execute(scripted_plan(1, {scripted_step(1, 1, {7, 8}, 0), scripted_step(2, 1, {9}, 0)}));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{40, testing::ordinary_token(0)}));
  // The sampled token first, then the script's next one, at the default logprob.
  ASSERT_EQ(r->tokens[0].top_logprobs.size(), 2u);
  EXPECT_EQ(r->tokens[0].top_logprobs[1].token, 41);
  EXPECT_EQ(r->tokens[0].top_logprobs[1].logprob, -0.5f);
  r = exec.execute(scripted_plan(2, {scripted_step(1, 2, {40}, 2), scripted_step(2, 2, {100}, 1)}));
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{41, testing::ordinary_token(1)}));
  r = exec.execute(scripted_plan(3, {scripted_step(1, 3, {41}, 3)}));
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{testing::ordinary_token(2)}));  // past the script
  EXPECT_EQ(exec.steps(), 3);
  EXPECT_EQ(exec.steps_entered(), 3);
  EXPECT_EQ(exec.fed(), 3 + 2 + 1);
}

TEST(ScriptedExecutorTest, FailuresCarryTheirMessageUntilStopped) {
  ScriptedExecutor exec(testing::script_then({5}, 2));
  exec.fail_on(9, "bad prompt");
  StatusOr<StepResult> r = exec.execute(scripted_plan(1, {scripted_step(1, 1, {9}, 0)}));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_EQ(r.status().message(), "bad prompt");
  r = exec.execute(scripted_plan(2, {scripted_step(2, 1, {8}, 0)}));
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{5}));
  exec.fail_every_step("all down");
  r = exec.execute(scripted_plan(3, {scripted_step(2, 2, {5}, 1)}));
  EXPECT_EQ(r.status().message(), "all down");
  exec.stop_failing();
  r = exec.execute(scripted_plan(4, {scripted_step(3, 1, {8}, 0)}));
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{5}));
  EXPECT_EQ(exec.steps(), 2);
  EXPECT_EQ(exec.steps_entered(), 4);
}

TEST(ScriptedExecutorTest, BrokenInvariantsAreTestFailures) {
  ScriptedExecutor exec;
  // Version 2 of a sequence the executor never held: the plan is refused.
  EXPECT_NONFATAL_FAILURE(
      EXPECT_FALSE(exec.execute(scripted_plan(1, {scripted_step(1, 2, {5}, 3)})).is_ok()), "refused the plan");
  // A per-prompt script needs every sequence's first prompt token; a prefix-cache hit hides it.
  exec.script(7, {40});
  EXPECT_NONFATAL_FAILURE(
      EXPECT_FALSE(exec.execute(scripted_plan(2, {scripted_step(2, 1, {8}, 4)})).is_ok()), "first prompt token");
  EXPECT_EQ(exec.steps(), 0);
}

TEST(ScriptedExecutorTest, InFrontOfAModelItPassesPlansOnAndWatches) {
  ScriptedExecutor model(testing::script_then({60, 61}, 2));
  ScriptedExecutor front(static_cast<StepExecutor&>(model));
  std::vector<int32_t> tables;
  front.observe([&tables](const SeqView& v) { tables.push_back(v.state->block_table.at(0)); });
  StatusOr<StepResult> r = front.execute(scripted_plan(1, {scripted_step(1, 1, {7, 8, 9}, 0)}));
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{60}));
  r = front.execute(scripted_plan(2, {scripted_step(1, 2, {60}, 3)}));
  EXPECT_EQ(scripted_tokens(r), (std::vector<int32_t>{61}));
  EXPECT_EQ(front.fed(), 4);
  EXPECT_EQ(model.fed(), 4);
  EXPECT_EQ(tables, (std::vector<int32_t>{0, 0}));
}

}  // namespace
}  // namespace tessera
