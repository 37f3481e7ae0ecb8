// Parallel sampling (n > 1): one prefill, then a fork through BlockManager::fork. The fake
// executor's shadow KV cache checks that every choice reads its own tokens at every
// position (copy-on-write of the shared tail block, preemption and recompute of a forked
// choice, prefix hits); the block manager's counters show the prompt was allocated once.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "coordinator/engine/request.h"
#include "coordinator/engine/scheduler.h"
#include "tests/coordinator/kv_checking_executor.h"

namespace tessera {
namespace {

using testing::KvCheckingExecutor;

SchedulerConfig fork_config() {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 64;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 256;
  return c;
}

std::vector<int32_t> fork_prompt(int len, int32_t base = 100) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int i = 0; i < len; ++i) p[static_cast<size_t>(i)] = base + i;
  return p;
}

std::shared_ptr<const Request> request_with_n(std::vector<int32_t> prompt, int n, int max_tokens,
                                              std::optional<uint64_t> seed = std::nullopt) {
  auto r = std::make_shared<Request>();
  r->prompt = std::move(prompt);
  r->n = n;
  r->max_tokens = max_tokens;
  r->sampling.seed = seed;
  return r;
}

// Drives a scheduler and the fake executor; records what each sequence was fed and drew.
struct ForkHarness {
  explicit ForkHarness(SchedulerConfig c) : sched(c), exec(c.block_size, c.num_blocks) {}

  void add(RequestId id, std::shared_ptr<const Request> r) {
    for (int c = 0; c < r->n; ++c) exec.add(choice_seq_id(id, c), r->prompt);  // what every choice will read
    ASSERT_TRUE(sched.add_request(id, std::move(r)).is_ok());
  }

  std::vector<SequenceEvent> step() {
    StepPlan plan = sched.schedule();
    const StepResult result = exec.execute(plan);
    // The seeds as the executor holds them (they travel with each sequence's first step).
    for (const testing::ResolvedStep& s : exec.last_plan().seqs) {
      fed[s.seq_id] += static_cast<int>(s.tokens.size());
      if (s.sample) seeds[s.seq_id].insert(s.sampling.seed.value_or(0));
    }
    std::vector<SequenceEvent> events = sched.on_step_result(plan, result);
    exec.apply(events);
    for (const SequenceEvent& e : events) {
      for (const SampledToken& t : e.new_tokens) outputs[e.seq_id].push_back(t.token);
      if (e.finished) reasons[e.seq_id] = e.reason;
    }
    sched.check_invariants();
    return events;
  }
  void run(int max_steps = 10000) {
    for (int i = 0; i < max_steps && sched.has_work(); ++i) step();
    EXPECT_FALSE(sched.has_work()) << "did not finish in " << max_steps << " steps";
  }
  // What a sequence draws as its k-th token (the fake's function of id and index).
  std::vector<int32_t> expected(SeqId seq, int count) const {
    std::vector<int32_t> out;
    for (int k = 0; k < count; ++k) out.push_back(exec.token_for(seq, k));
    return out;
  }

  Scheduler sched;
  KvCheckingExecutor exec;
  std::map<SeqId, int> fed;
  std::map<SeqId, std::set<uint64_t>> seeds;
  std::map<SeqId, std::vector<int32_t>> outputs;
  std::map<SeqId, FinishReason> reasons;
};

TEST(SchedulerForkTest, PromptIsPrefilledOnceAndEveryChoiceDrawsWithItsOwnSeed) {
  ForkHarness h(fork_config());
  h.add(1, request_with_n(fork_prompt(16), 3, 5, /*seed=*/100));
  h.step();
  // One step computes the whole prompt (choice 0) and starts the two other choices, which
  // feed nothing and sample from choice 0's logits row.
  const testing::ResolvedPlan& first = h.exec.last_plan();
  ASSERT_EQ(first.seqs.size(), 3u);
  EXPECT_EQ(first.seqs[0].tokens.size(), 16u);
  EXPECT_EQ(first.seqs[0].sample_from, 0u);
  for (int c = 1; c < 3; ++c) {
    const testing::ResolvedStep& s = first.seqs[static_cast<size_t>(c)];
    EXPECT_EQ(s.seq_id, choice_seq_id(1, c));
    EXPECT_TRUE(s.tokens.empty());
    EXPECT_TRUE(s.sample);
    EXPECT_EQ(s.sample_from, choice_seq_id(1, 0));
    EXPECT_EQ(s.num_computed, 16);
    EXPECT_EQ(s.block_table, first.seqs[0].block_table) << "choice " << c << " shares the prompt's blocks";
  }
  h.run();
  const BlockManagerStats b = h.sched.block_manager().stats();
  // Blocks 0..3 hold the prompt, allocated once; it ends on a block boundary, so no choice
  // writes into a shared block (no copy) and each choice's output (positions 16..19) gets one
  // block of its own.
  EXPECT_EQ(b.cow_copies, 0u);
  EXPECT_EQ(b.blocks_allocated, 4u + 3u);
  EXPECT_EQ(b.num_free, b.num_blocks) << "every block back (free or cached)";
  for (int c = 0; c < 3; ++c) {
    const SeqId seq = choice_seq_id(1, c);
    // Choice 0 fed the 16 prompt tokens, then each choice its first 4 outputs.
    EXPECT_EQ(h.fed[seq], (c == 0 ? 16 : 0) + 4) << "choice " << c;
    EXPECT_EQ(h.outputs[seq], h.expected(seq, 5)) << "choice " << c;
    EXPECT_EQ(h.reasons[seq], FinishReason::kLength) << "choice " << c;
    EXPECT_EQ(h.seeds[seq], (std::set<uint64_t>{100u + static_cast<uint64_t>(c)})) << "choice " << c;
  }
}

TEST(SchedulerForkTest, APromptEndingInsideABlockIsCopiedOnceForEachChoiceButTheLast) {
  SchedulerConfig c = fork_config();
  c.max_num_batched_tokens = 4;  // chunked: the fork comes with the last chunk
  ForkHarness h(c);
  h.add(1, request_with_n(fork_prompt(10), 3, 4));
  h.run();
  const BlockManagerStats b = h.sched.block_manager().stats();
  // Block 2 holds positions 8..11: the prompt's last two and each choice's first output.
  // Every choice writes position 10 into it: the first two writers take a copy, the last
  // one left writes the original.
  EXPECT_EQ(b.cow_copies, 2u);
  EXPECT_EQ(b.blocks_allocated, 3u + 2u + 3u);  // prompt, two copies, one more block each
  int prompt_fed = 0;
  for (int k = 0; k < 3; ++k) {
    const SeqId seq = choice_seq_id(1, k);
    prompt_fed += h.fed[seq] - 3;  // 3 of each choice's 4 outputs are fed
    EXPECT_EQ(h.outputs[seq], h.expected(seq, 4)) << "choice " << k;
  }
  EXPECT_EQ(prompt_fed, 10) << "the prompt is computed once";
}

TEST(SchedulerForkTest, UnseededChoicesGetDistinctSeedsFromTheirSequenceIds) {
  ForkHarness h(fork_config());
  auto r = std::make_shared<Request>();
  r->prompt = fork_prompt(9);
  r->n = 2;
  r->max_tokens = 2;
  r->sampling.temperature = 0.7f;
  h.add(5, r);
  h.run();
  ASSERT_EQ(h.seeds[choice_seq_id(5, 0)].size(), 1u);
  ASSERT_EQ(h.seeds[choice_seq_id(5, 1)].size(), 1u);
  EXPECT_NE(*h.seeds[choice_seq_id(5, 0)].begin(), *h.seeds[choice_seq_id(5, 1)].begin());
}

TEST(SchedulerForkTest, ForkOnTheLastPromptTokenWhenThePrefixCacheHoldsTheRest) {
  ForkHarness h(fork_config());
  h.add(1, request_with_n(fork_prompt(16), 1, 2));
  h.run();
  const uint64_t before = h.sched.block_manager().stats().blocks_allocated;
  // The same prompt again, n = 2: its 15 tokens before the last are all cached, so choice 0
  // computes only position 15 and choice 1 samples from that.
  h.add(2, request_with_n(fork_prompt(16), 2, 3));
  h.run();
  for (int c = 0; c < 2; ++c) {
    const SeqId seq = choice_seq_id(2, c);
    EXPECT_EQ(h.fed[seq], (c == 0 ? 1 : 0) + 2) << "choice " << c << ": position 15 once, then 2 of its 3 outputs";
    EXPECT_EQ(h.outputs[seq], h.expected(seq, 3)) << "choice " << c;
  }
  // No copy: choice 0 owns the cached last prompt block alone when it rewrites position 15
  // (same token, same KV) and choice 1 samples from that step; one output block per choice.
  EXPECT_EQ(h.sched.block_manager().stats().cow_copies, 0u);
  EXPECT_EQ(h.sched.block_manager().stats().blocks_allocated - before, 2u);
}

TEST(SchedulerForkTest, PreemptedForkedChoicesAreRecomputedAsPromptPlusOutput) {
  SchedulerConfig c = fork_config();
  c.num_blocks = 14;  // 56 tokens: three choices of 10 + 30 cannot all hold their blocks
  ForkHarness h(c);
  h.add(1, request_with_n(fork_prompt(10), 3, 30));
  h.run();
  EXPECT_GT(h.sched.stats().num_preemptions, 0u);
  for (int k = 0; k < 3; ++k) {
    const SeqId seq = choice_seq_id(1, k);
    EXPECT_EQ(h.outputs[seq], h.expected(seq, 30)) << "choice " << k;
    EXPECT_EQ(h.reasons[seq], FinishReason::kLength) << "choice " << k;
  }
}

TEST(SchedulerForkTest, ChoicesBeyondMaxNumSeqsQueueAndStillMatch) {
  SchedulerConfig c = fork_config();
  c.max_num_seqs = 2;
  ForkHarness h(c);
  h.add(1, request_with_n(fork_prompt(1), 4, 3));  // choice 1 samples beside choice 0; 2 and 3 queue
  h.run();
  for (int k = 0; k < 4; ++k) {
    const SeqId seq = choice_seq_id(1, k);
    EXPECT_EQ(h.outputs[seq], h.expected(seq, 3)) << "choice " << k;
  }
}

TEST(SchedulerForkTest, StaticBatchKeepsEveryChoiceInTheBatch) {
  SchedulerConfig c = fork_config();
  c.mode = BatchingMode::kStatic;
  c.max_num_seqs = 2;  // the batch's fork overflows: the queued choice is still a member
  ForkHarness h(c);
  h.add(1, request_with_n(fork_prompt(6), 3, 4));
  h.add(2, request_with_n(fork_prompt(5, 300), 1, 2));
  h.run();
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(h.outputs[choice_seq_id(1, k)], h.expected(choice_seq_id(1, k), 4)) << "choice " << k;
  EXPECT_EQ(h.outputs[2], h.expected(2, 2));
}

TEST(SchedulerForkTest, AbortingOneChoiceLeavesTheOthersRunning) {
  ForkHarness h(fork_config());
  h.add(1, request_with_n(fork_prompt(8), 3, 6));
  for (int i = 0; i < 3; ++i) h.step();  // prefill and fork, then two tokens each
  ASSERT_NE(h.sched.find(choice_seq_id(1, 1)), nullptr);
  EXPECT_TRUE(h.sched.abort_choice(1, 1));
  EXPECT_FALSE(h.sched.abort_choice(1, 1));
  h.exec.forget(choice_seq_id(1, 1));
  h.run();
  EXPECT_EQ(h.outputs[choice_seq_id(1, 0)], h.expected(choice_seq_id(1, 0), 6));
  EXPECT_EQ(h.outputs[choice_seq_id(1, 2)], h.expected(choice_seq_id(1, 2), 6));
  EXPECT_EQ(h.sched.block_manager().stats().num_free, h.sched.block_manager().stats().num_blocks);
  // The whole request: nothing left of it.
  EXPECT_FALSE(h.sched.abort(1));
}

TEST(SchedulerForkTest, AbortBeforeTheForkEndsTheRequest) {
  SchedulerConfig c = fork_config();
  c.max_num_batched_tokens = 8;
  ForkHarness h(c);
  h.add(1, request_with_n(fork_prompt(30), 4, 6));
  h.step();  // the first prefill chunk
  ASSERT_TRUE(h.sched.find(1)->fork_pending());
  EXPECT_TRUE(h.sched.abort(1));
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.sched.find(choice_seq_id(1, 1)), nullptr);
  EXPECT_EQ(h.sched.block_manager().stats().num_free, c.num_blocks);
}

TEST(SchedulerForkTest, AFailedStepEndsEveryChoiceForkedOrNot) {
  // 10 tokens in one step (the step that forks), or a first chunk of 4 (before the fork).
  for (const int budget : {64, 4}) {
    SchedulerConfig c = fork_config();
    c.max_num_batched_tokens = budget;
    ForkHarness h(c);
    h.add(7, request_with_n(fork_prompt(10), 3, 4));
    const StepPlan plan = h.sched.schedule();
    EXPECT_EQ(plan.seqs.size(), budget == 64 ? 3u : 1u);
    StepResult failed;
    failed.step_id = plan.step_id;
    failed.error = "device lost";
    const std::vector<SequenceEvent> events = h.sched.on_step_result(plan, failed);
    ASSERT_EQ(events.size(), 3u) << "budget " << budget;
    std::set<SeqId> ended;
    for (const SequenceEvent& e : events) {
      EXPECT_TRUE(e.finished);
      EXPECT_EQ(e.reason, FinishReason::kError);
      EXPECT_EQ(e.error, "device lost");
      ended.insert(e.seq_id);
    }
    EXPECT_EQ(ended, (std::set<SeqId>{choice_seq_id(7, 0), choice_seq_id(7, 1), choice_seq_id(7, 2)}));
    EXPECT_FALSE(h.sched.has_work());
    EXPECT_EQ(h.sched.block_manager().stats().num_free, c.num_blocks);
  }
}

TEST(SchedulerForkTest, RequestsAreCheckedOnce) {
  Scheduler s(fork_config());
  auto bad_n = std::make_shared<Request>();
  bad_n->prompt = fork_prompt(3);
  bad_n->n = kMaxChoices + 1;
  const Status st = s.add_request(3, bad_n);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("request 3: n must be in [1, 128]"), std::string::npos) << st.message();
  EXPECT_EQ(s.add_request(0, request_with_n(fork_prompt(3), 1, 2)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.add_request(kMaxRequestId + 1, request_with_n(fork_prompt(3), 1, 2)).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
