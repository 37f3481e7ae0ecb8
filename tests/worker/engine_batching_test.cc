// Continuous batching must not change any sequence's tokens: the fixture prompts run
// together through Engine + Scheduler + Executor, arriving at different steps, with
// chunked prefill forced small and with a KV pool too small for all of them (preemption
// by recompute), and each must still produce the reference's greedy ids. Sliding-window
// models also run with the blocks their window has left freed (and reused) as they go.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>

#include "coordinator/engine/engine.h"
#include "kernels/backend.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "tests/worker/golden_model_fixture.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

using Case = testing::GoldenIds;

struct RunStats {
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t window_releases = 0;
  int most_held = 0;           // most KV blocks one sequence held in a step
  int most_held_one_token = 0; // ditto, in steps feeding it one token (decodes)
};

// Adds request i at step i * `stagger`, runs to completion, returns each request's output.
std::vector<std::vector<int32_t>> run_engine(Transformer& model, Backend& backend, const std::vector<Case>& cases,
                                             SchedulerConfig sc, int stagger, const SamplingParams& sampling,
                                             RunStats* stats) {
  Executor model_executor(model, backend, sc.block_size, sc.num_blocks, model.dtype());
  RunStats local;
  if (stats == nullptr) stats = &local;
  // Counts the blocks each sequence holds in each step: its table (as the executor holds it
  // once the step's delta is applied) minus the entries a sliding window freed (-1).
  testing::ScriptedExecutor executor(model_executor);
  executor.observe([stats](const SeqView& v) {
    const std::vector<int32_t>& table = v.state->block_table;
    const int held = static_cast<int>(std::count_if(table.begin(), table.end(), [](int32_t b) { return b >= 0; }));
    stats->most_held = std::max(stats->most_held, held);
    if (v.step->tokens.size() == 1) stats->most_held_one_token = std::max(stats->most_held_one_token, held);
  });
  Engine engine(sc, executor);
  std::map<SeqId, size_t> index_of;
  std::vector<std::vector<int32_t>> outputs(cases.size());
  size_t next = 0;
  for (uint64_t step = 0; next < cases.size() || engine.has_work(); ++step) {
    while (next < cases.size() && step >= next * static_cast<uint64_t>(stagger)) {
      StopConditions stop;
      stop.ignore_eos = true;
      const RequestId id = next + 1;
      const Status st =
          engine.add_request(id, make_request(cases[next].prompt, static_cast<int>(cases[next].greedy.size()), sampling, stop));
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      if (!st.is_ok()) return outputs;
      index_of[id] = next++;
    }
    for (const SequenceEvent& ev : engine.step()) {
      EXPECT_NE(ev.reason, FinishReason::kError) << ev.error;
      for (const SampledToken& t : ev.new_tokens) outputs[index_of[ev.seq_id]].push_back(t.token);
    }
    EXPECT_LT(step, 100000u) << "engine did not finish";
    if (step >= 100000u) break;
  }
  stats->preemptions = engine.scheduler().stats().num_preemptions;
  stats->steps = engine.steps();
  stats->window_releases = engine.scheduler().stats().window_releases;
  return outputs;
}

class EngineBatchingTest : public testing::GoldenModelTest {};

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

// Models whose every layer has a sliding window W: the scheduler frees each sequence's
// blocks once they lie wholly before its next step's first window, the worker runs with -1
// in their place, and the greedy ids stay the reference's. The longest golden case (64 + 24
// = 88 tokens) is over 3 W. Bounds with block size B: a step writing c tokens reads a span of
// W - 1 + c tokens, at most ceil((W + c - 2) / B) + 1 blocks; for one token that is
// ceil((W - 1) / B) + 1 <= ceil(W / B) + 1.
class SlidingWindowEngineTest : public EngineBatchingTest {};

TEST_P(SlidingWindowEngineTest, FreedBlocksKeepTheReferenceIdsAndBoundWhatASequenceHolds) {
  const int w = model_->config().kv_window();
  ASSERT_GT(w, 0) << GetParam() << " has a layer without a window";
  size_t longest = 0;
  for (const Case& c : cases_) longest = std::max(longest, c.prompt.size() + c.greedy.size());
  ASSERT_GE(longest, 3u * static_cast<size_t>(w));

  SchedulerConfig sc;
  sc.block_size = 4;
  sc.num_blocks = blocks_for_all(sc.block_size);
  sc.max_num_batched_tokens = 8;  // chunked prefill: the long prompts slide the window too
  sc.max_model_len = 4096;
  sc.sliding_window = w;
  const int bs = sc.block_size, chunk = sc.max_num_batched_tokens;
  const int one_token_bound = (w - 1 + bs - 1) / bs + 1;
  const int chunk_bound = (w + chunk - 2 + bs - 1) / bs + 1;
  const int full = static_cast<int>((longest + bs - 1) / bs);  // what full attention holds

  // One at a time.
  RunStats alone;
  for (size_t i = 0; i < cases_.size(); ++i) {
    RunStats one;
    auto out = run_engine(*model_, *backend_, {cases_[i]}, sc, 0, SamplingParams{}, &one);
    EXPECT_EQ(out[0], cases_[i].greedy) << "case " << i << " alone";
    alone.most_held = std::max(alone.most_held, one.most_held);
    alone.most_held_one_token = std::max(alone.most_held_one_token, one.most_held_one_token);
    alone.window_releases += one.window_releases;
  }
  // All batched, arriving two steps apart.
  RunStats together;
  auto out = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/2, SamplingParams{}, &together);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(out[i], cases_[i].greedy) << "case " << i << " batched";
  // In a pool that holds only the longest sequence at full length: preemption by recompute
  // (which re-allocates from scratch) mixed with freed blocks being reused by others.
  SchedulerConfig tight = sc;
  tight.num_blocks = full;
  tight.max_num_batched_tokens = 16;
  RunStats pressed;
  out = run_engine(*model_, *backend_, cases_, tight, /*stagger=*/0, SamplingParams{}, &pressed);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(out[i], cases_[i].greedy) << "case " << i << " tight pool";

  for (const RunStats* r : {&alone, &together}) {
    EXPECT_GT(r->window_releases, 0u);
    EXPECT_LE(r->most_held_one_token, one_token_bound);
    EXPECT_LE(r->most_held, chunk_bound);
  }
  EXPECT_EQ(alone.most_held_one_token, one_token_bound) << "the 88-token case reaches the bound";
  EXPECT_LE(one_token_bound, (w + bs - 1) / bs + 1);  // ceil(W / B) + 1
  EXPECT_LE(pressed.most_held_one_token, one_token_bound);
  std::cout << "[ REPORT   ] " << GetParam() << ": window " << w << ", block size " << bs << ", longest case "
            << longest << " tokens; most KV blocks one sequence held: " << alone.most_held_one_token
            << " alone / " << together.most_held_one_token << " batched in one-token steps (bound ceil((W-1)/B)+1 = "
            << one_token_bound << ", ceil(W/B)+1 = " << (w + bs - 1) / bs + 1 << "), " << alone.most_held << " / "
            << together.most_held << " in any step (bound with " << chunk << "-token chunks " << chunk_bound
            << "); full attention holds " << full << "; " << alone.window_releases << " / "
            << together.window_releases << " blocks freed by the window; pool of " << full << " blocks: "
            << pressed.preemptions << " preemptions, most held " << pressed.most_held_one_token << std::endl;
}

// The worker takes -1 only where no query of the step looks: blocks wholly before the first
// new token's window. One freed block too many is refused, not read.
TEST_P(SlidingWindowEngineTest, ExecutorTakesFreedEntriesOnlyBeforeTheWindow) {
  const int w = model_->config().kv_window();
  ASSERT_GT(w, 0);
  const int bs = 4, n = 2 * w + 2;  // the first new token at n reads keys n - w + 1 ..
  const int first_block = (n - w + 1) / bs;
  ASSERT_GT(first_block, 0);
  Executor executor(*model_, *backend_, bs, 64, model_->dtype());
  auto plan_with = [&](int freed) {
    StepPlan plan;
    SeqStep& s = plan.seqs.emplace_back();
    s.seq_id = 1;
    s.tokens = {1};
    s.num_computed = n;
    s.sample = true;
    s.version = 1;
    s.start.emplace();
    for (int k = 0; k <= n / bs; ++k) s.new_blocks.push_back(k < freed ? -1 : k);
    s.num_released = freed;
    return plan;
  };
  auto ok = executor.execute(plan_with(first_block));
  EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();
  auto refused = executor.execute(plan_with(first_block + 1));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("table entry " + std::to_string(first_block)), std::string::npos)
      << refused.status().to_string();
}

auto fixture_name = [](const auto& info) {
  std::string n = info.param;
  for (char& c : n) if (c == '-') c = '_';
  return n;
};

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineBatchingTest,
                         ::testing::Values("tiny-bloom", "tiny-llama", "tiny-mixtral", "kjv-llama"), fixture_name);
INSTANTIATE_TEST_SUITE_P(Fixtures, SlidingWindowEngineTest, ::testing::Values("tiny-mistral-swa", "tiny-starcoder2"),
                         fixture_name);

}  // namespace
}  // namespace tessera
