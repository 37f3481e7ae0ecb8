// Step deltas from the scheduler's side: a sequence's state goes out once, then each step
// carries only what changed — so a steady decode step's frame grows with the number of
// sequences, not with their context length — and the executors are told to forget what
// finished or was preempted. The fake executor applies every plan through the worker's
// SequenceStates, so a delta the scheduler gets wrong is a refused plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "common/wire/messages.h"
#include "coordinator/engine/scheduler.h"
#include "tests/coordinator/kv_checking_executor.h"

namespace tessera {
namespace {

using testing::KvCheckingExecutor;

// Largest encoding of a one-token decode step that opens at most one block: seq_id,
// version, num_computed, sample, num_draft, propose, table_from, num_released, the token array (length + one
// token), the new-block array (length + at most one block), has_start.
constexpr size_t kMaxDecodeSeqBytes = 8 + 4 + 4 + 1 + 4 + 4 + 4 + 4 + (4 + 4) + (4 + 4) + 1;
// Header, step_id, the dropped / seqs / copies counts, return_logits, the LoRA loads / unloads
// counts.
constexpr size_t kPlanOverheadBytes = wire::kHeaderBytes + 8 + 4 + 4 + 4 + 1 + 4 + 4;

struct Driver {
  Scheduler sched;
  KvCheckingExecutor exec;
  explicit Driver(const SchedulerConfig& c) : sched(c), exec(c.block_size, c.num_blocks) {}

  StepPlan step() {
    StepPlan plan = sched.schedule();
    const StepResult result = exec.execute(plan);
    exec.apply(sched.on_step_result(plan, result));
    sched.check_invariants();
    return plan;
  }
};

// The encoded size of the first step in which every one of `n` sequences of `context`
// prompt tokens decodes, with sampling and a penalty that today need state on the executors.
size_t steady_decode_frame_bytes(int n, int context) {
  SchedulerConfig c;
  c.block_size = 16;
  c.max_num_seqs = n;
  c.max_num_batched_tokens = 8192;
  c.max_model_len = context + 64;
  c.num_blocks = n * (context + 64) / c.block_size + 8;
  c.prefix_caching = false;
  Driver run(c);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.repetition_penalty = 1.2f;
  sp.logprobs = 2;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    std::iota(prompt.begin(), prompt.end(), i);
    for (int32_t& t : prompt) t %= 50;
    run.exec.add(static_cast<SeqId>(i + 1), prompt);
    EXPECT_TRUE(run.sched.add_request(static_cast<SeqId>(i + 1), make_request(prompt, 20, sp)).is_ok());
  }
  for (int guard = 0; guard < 1000; ++guard) {
    const StepPlan plan = run.step();
    const bool all_decode = static_cast<int>(plan.seqs.size()) == n &&
                            std::all_of(plan.seqs.begin(), plan.seqs.end(), [](const SeqStep& s) {
                              return s.tokens.size() == 1 && !s.start && s.num_computed % 16 != 0;
                            });
    // A decode step that opens no new block (the block-opening one adds 4 bytes a sequence).
    if (all_decode) return wire::encode(plan).size();
  }
  ADD_FAILURE() << "never reached a steady decode step";
  return 0;
}

TEST(StepDeltas, SteadyDecodeFrameGrowsWithSequencesNotContext) {
  const size_t short_ctx = steady_decode_frame_bytes(32, 64);
  const size_t long_ctx = steady_decode_frame_bytes(32, 2048);
  const size_t more_seqs = steady_decode_frame_bytes(64, 64);
  std::cout << "[ REPORT   ] steady decode frame: 32 seqs x 64 tokens " << short_ctx << " B, 32 x 2048 " << long_ctx
            << " B, 64 x 64 " << more_seqs << " B" << std::endl;
  EXPECT_EQ(short_ctx, long_ctx) << "context length must not change a decode step's frame";
  EXPECT_LE(long_ctx, kPlanOverheadBytes + 32 * kMaxDecodeSeqBytes);
  EXPECT_LE(more_seqs, kPlanOverheadBytes + 64 * kMaxDecodeSeqBytes);
  EXPECT_GT(more_seqs, short_ctx) << "twice the sequences, more bytes";
}

TEST(StepDeltas, StateTravelsOnceAndFinishedOrPreemptedSequencesAreDropped) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 9;  // 36 tokens: 10-token prompts growing to 18 and 30 tokens do not both fit
  c.max_num_batched_tokens = 64;
  c.max_model_len = 64;
  c.prefix_caching = false;
  Driver run(c);
  SamplingParams sp;
  sp.frequency_penalty = 0.5f;
  const std::vector<int32_t> p1(10, 3), p2(10, 4);
  run.exec.add(1, p1);
  run.exec.add(2, p2);
  ASSERT_TRUE(run.sched.add_request(1, make_request(p1, 8, sp)).is_ok());
  ASSERT_TRUE(run.sched.add_request(2, make_request(p2, 20)).is_ok());
  std::map<SeqId, int> starts;
  bool saw_drop_of_1 = false;
  SeqId preempted_dropped = 0;
  uint64_t preemptions = 0;
  while (run.sched.has_work()) {
    const StepPlan plan = run.step();
    for (SeqId id : plan.dropped) {
      if (id == 1) saw_drop_of_1 = true;
      if (run.sched.find(id) != nullptr) preempted_dropped = id;  // still live: preempted
    }
    for (const SeqStep& s : plan.seqs) {
      ASSERT_EQ(s.start.has_value(), s.version == 1) << "sequence " << s.seq_id;
      if (s.start) ++starts[s.seq_id];
      if (!s.start) { EXPECT_GE(s.table_from, s.num_computed / c.block_size) << "unchanged entries resent"; }
    }
    ASSERT_LT(run.sched.stats().num_steps, 500u);
    preemptions = run.sched.stats().num_preemptions;
  }
  EXPECT_TRUE(saw_drop_of_1) << "a finished sequence's state is dropped";
  ASSERT_GT(preemptions, 0u) << "the pool is meant to force a preemption";
  EXPECT_NE(preempted_dropped, 0u) << "a preempted sequence's state is dropped";
  EXPECT_EQ(starts[preempted_dropped], 1 + static_cast<int>(preemptions)) << "resumed = started in full again";
  // Everything ran to its length with the tokens the fake executor derives from (id, index).
  EXPECT_EQ(run.exec.tokens(1).size(), 18u);
  EXPECT_EQ(run.exec.tokens(2).size(), 30u);
}

TEST(StepDeltas, LostKvCachesResendEverySequenceInFull) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 32;
  Driver run(c);
  for (SeqId id : {1, 2}) {
    const std::vector<int32_t> p(6, static_cast<int32_t>(id));
    run.exec.add(id, p);
    ASSERT_TRUE(run.sched.add_request(id, make_request(p, 10)).is_ok());
  }
  run.step();
  run.step();
  run.sched.on_kv_cache_lost();
  // A fresh executor (a restarted worker) takes the next plan: every sequence starts again.
  KvCheckingExecutor fresh(c.block_size, c.num_blocks);
  for (SeqId id : {1, 2}) fresh.add(id, run.exec.tokens(id));
  const StepPlan plan = run.sched.schedule();
  ASSERT_EQ(plan.seqs.size(), 2u);
  for (const SeqStep& s : plan.seqs) {
    EXPECT_EQ(s.version, 1u);
    ASSERT_TRUE(s.start.has_value());
    EXPECT_EQ(s.num_computed, 0) << "the KV is gone: recomputed from the first token";
  }
  EXPECT_EQ(plan.dropped.size(), 2u) << "the old executors forget both";
  const StepResult result = fresh.execute(plan);
  EXPECT_EQ(result.tokens.size(), 2u);
}

}  // namespace
}  // namespace tessera
