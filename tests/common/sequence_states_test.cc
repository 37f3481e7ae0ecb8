// SequenceStates: the executor's side of step deltas. A start carries a sequence's state
// once; later steps must follow it version by version, and anything that does not fit what
// this executor holds is refused with the sequence named — and changes nothing.
#include "common/sequence_states.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

constexpr int kBlockSize = 4;

SeqStep start_step(SeqId id, std::vector<int32_t> tokens, std::vector<int32_t> blocks, SamplingParams sp = {}) {
  SeqStep s;
  s.seq_id = id;
  s.version = 1;
  s.tokens = std::move(tokens);
  s.sample = true;
  s.new_blocks = std::move(blocks);
  SeqStart& st = s.start.emplace();
  st.sampling = sp;
  st.prompt_len = static_cast<int32_t>(s.tokens.size());
  return s;
}

SeqStep decode_step(SeqId id, uint32_t version, int32_t num_computed, int32_t token, int32_t table_from,
                    std::vector<int32_t> new_blocks = {}) {
  SeqStep s;
  s.seq_id = id;
  s.version = version;
  s.tokens = {token};
  s.num_computed = num_computed;
  s.sample = true;
  s.table_from = table_from;
  s.new_blocks = std::move(new_blocks);
  return s;
}

StepPlan plan_of(uint64_t step, std::vector<SeqStep> seqs, std::vector<SeqId> dropped = {}) {
  StepPlan p;
  p.step_id = step;
  p.seqs = std::move(seqs);
  p.dropped = std::move(dropped);
  return p;
}

// `plan` is refused with a message containing `why`.
void expect_refusal(SequenceStates& states, const StepPlan& plan, const std::string& why) {
  auto r = states.apply(plan);
  ASSERT_FALSE(r.is_ok()) << why;
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().to_string();
}

TEST(SequenceStates, DeltasRebuildTheTableTheHistoryAndTheTokenIndex) {
  SequenceStates states(kBlockSize, 16);
  SamplingParams sp;
  sp.repetition_penalty = 1.3f;
  ASSERT_TRUE(states.apply(plan_of(0, {start_step(7, {5, 6, 7}, {3}, sp)})).is_ok());
  auto v = states.apply(plan_of(1, {decode_step(7, 2, 3, 40, 1)}));
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->at(0).num_generated(), 1);
  // Position 4 opens a second block.
  v = states.apply(plan_of(2, {decode_step(7, 3, 4, 41, 1, {9})}));
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->at(0).state->block_table, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(v->at(0).num_generated(), 2);
  EXPECT_EQ(v->at(0).penalty_tokens(), (std::vector<int32_t>{5, 6, 7, 40, 41}));
  // Copy-on-write replaces the last entry; a window releases the first.
  SeqStep cow = decode_step(7, 4, 5, 42, 1, {11});
  cow.num_released = 1;
  v = states.apply(plan_of(3, {cow}));
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->at(0).state->block_table, (std::vector<int32_t>{-1, 11}));
}

TEST(SequenceStates, AWrongVersionIsRefusedAndChangesNothing) {
  SequenceStates states(kBlockSize, 16);
  ASSERT_TRUE(states.apply(plan_of(0, {start_step(1, {5, 6}, {0}), start_step(2, {8}, {1})})).is_ok());
  // Sequence 2's step skips version 2 (a step this executor never saw): the whole plan is
  // refused, sequence 1's valid step included.
  auto refused = states.apply(plan_of(1, {decode_step(1, 2, 2, 30, 1), decode_step(2, 3, 1, 31, 1)}));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("sequence 2: version 3 does not follow version 1"), std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(states.find(1)->version, 1u);
  EXPECT_EQ(states.find(1)->num_fed, 2);
  // The right versions apply.
  auto ok = states.apply(plan_of(1, {decode_step(1, 2, 2, 30, 1), decode_step(2, 2, 1, 31, 1)}));
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(states.find(2)->num_fed, 2);
}

TEST(SequenceStates, StateItDoesNotHoldOrThatDisagreesIsRefused) {
  SequenceStates states(kBlockSize, 16);
  auto expect_refused = [&](const StepPlan& plan, const std::string& why) { expect_refusal(states, plan, why); };
  // A delta for a sequence never started here (a restarted worker).
  expect_refused(plan_of(0, {decode_step(9, 5, 10, 1, 3)}), "sequence 9: version 5 continues a sequence this executor does not hold");
  ASSERT_TRUE(states.apply(plan_of(0, {start_step(1, {5, 6}, {0})})).is_ok());
  expect_refused(plan_of(1, {decode_step(1, 2, 1, 30, 1)}), "num_computed 1 but 2 tokens were fed here");
  expect_refused(plan_of(1, {decode_step(1, 2, 2, 30, 3)}), "table change from entry 3 of a 1-entry table");
  expect_refused(plan_of(1, {decode_step(1, 2, 2, 30, 1, {16})}), "block 16 (table entry 1) outside the pool");
  expect_refused(plan_of(1, {decode_step(1, 2, 3, 30, 1)}), "num_computed 3");
  SeqStep overflow = decode_step(1, 2, 2, 30, 1);
  overflow.tokens = {1, 2, 3};  // positions 2..4 need a second block
  expect_refused(plan_of(1, {overflow}), "block table of 1 blocks cannot hold 5 tokens");
  SeqStep no_state = start_step(3, {1}, {2});
  no_state.start.reset();
  expect_refused(plan_of(1, {no_state}), "version 1 starts the sequence but carries no state");
  SeqStep late_state = decode_step(1, 2, 2, 30, 1);
  late_state.start.emplace();
  expect_refused(plan_of(1, {late_state}), "only version 1 may carry the starting state");
  expect_refused(plan_of(1, {decode_step(1, 2, 2, 30, 1), decode_step(1, 2, 2, 30, 1)}), "listed twice");
  SamplingParams sp;
  sp.presence_penalty = 0.5f;
  SeqStep hit = start_step(4, {9}, {3, 4}, sp);
  hit.num_computed = 5;  // a prefix-cache hit: the penalty needs the 5 tokens before
  expect_refused(plan_of(1, {hit}), "a penalty needs the 5 tokens before the step, got 0");
  // A dropped sequence is forgotten before the plan's steps run.
  expect_refused(plan_of(1, {decode_step(1, 2, 2, 30, 1)}, {1}), "does not hold");
  EXPECT_EQ(states.find(1)->version, 1u) << "refused plans change nothing, their drops included";
  ASSERT_TRUE(states.apply(plan_of(1, {}, {1})).is_ok());
  EXPECT_EQ(states.find(1), nullptr);
  EXPECT_EQ(states.size(), 0u);
}

// A forked choice's first step: no tokens, its parent's end, its parent's blocks.
SeqStep child_of(SeqId id, const SeqStep& parent, SeqId sample_from) {
  SeqStep s = start_step(id, {}, parent.new_blocks);
  s.num_computed = parent.num_computed + static_cast<int32_t>(parent.tokens.size());
  s.start->prompt_len = s.num_computed;
  s.start->sample_from = sample_from;
  return s;
}

TEST(SequenceStates, AForkedChoiceStartsBySamplingFromItsParentsStep) {
  SequenceStates states(kBlockSize, 16);
  const SeqStep parent = start_step(1, {5, 6, 7, 8, 9}, {0, 1});
  const StepPlan plan = plan_of(0, {parent, child_of(2, parent, 1)});  // the views point into it
  auto v = states.apply(plan);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->at(1).sample_from(), 1u);
  EXPECT_EQ(v->at(0).sample_from(), 0u);
  EXPECT_EQ(v->at(1).num_generated(), 0);
  EXPECT_EQ(v->at(1).state->block_table, (std::vector<int32_t>{0, 1}));
  // From then on it is a sequence like any other: its first decode feeds its first token.
  v = states.apply(plan_of(1, {decode_step(2, 2, 5, 40, 1, {3})}));
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->at(0).num_generated(), 1);
}

TEST(SequenceStates, ASampleFromThatDoesNotMatchAParentStepIsRefused) {
  SequenceStates states(kBlockSize, 16);
  auto expect_refused = [&](const StepPlan& plan, const std::string& why) {
    expect_refusal(states, plan, why);
    EXPECT_EQ(states.size(), 0u) << "refused plans change nothing";
  };
  const SeqStep parent = start_step(1, {5, 6, 7, 8, 9}, {0, 1});
  expect_refused(plan_of(0, {child_of(2, parent, 1), parent}),
                 "samples from sequence 1, which is not an earlier step of this plan");
  expect_refused(plan_of(0, {parent, child_of(2, parent, 7)}), "samples from sequence 7");
  expect_refused(plan_of(0, {parent, child_of(2, parent, 2)}), "samples from sequence 2");
  SeqStep chunk = parent;
  chunk.sample = false;  // a prefill chunk that ends before the prompt does yields no logits
  expect_refused(plan_of(0, {chunk, child_of(2, parent, 1)}), "not an earlier step of this plan computing tokens and sampling");
  SeqStep off = child_of(2, parent, 1);
  off.num_computed = 4;
  expect_refused(plan_of(0, {parent, off}), "num_computed 4 but sequence 1's step ends at 5");
  SeqStep fed = child_of(2, parent, 1);
  fed.tokens = {9};
  expect_refused(plan_of(0, {parent, fed}), "feeds no tokens and samples");
  SeqStep empty = start_step(3, {}, {4});
  expect_refused(plan_of(0, {empty}), "sequence 3: no tokens");
}

TEST(SequenceStates, AStartReplacesWhatWasHeld) {
  // A sequence resumed after preemption (or after the KV caches were lost) starts again.
  SequenceStates states(kBlockSize, 16);
  ASSERT_TRUE(states.apply(plan_of(0, {start_step(1, {5, 6}, {0})})).is_ok());
  ASSERT_TRUE(states.apply(plan_of(1, {decode_step(1, 2, 2, 30, 1)})).is_ok());
  SeqStep again = start_step(1, {5, 6, 30, 31}, {7});
  again.start->prompt_len = 2;
  auto v = states.apply(plan_of(2, {again}));
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->at(0).state->version, 1u);
  EXPECT_EQ(v->at(0).state->block_table, (std::vector<int32_t>{7}));
  EXPECT_EQ(v->at(0).num_generated(), 2);
}

// Speculative proposals: the last num_draft tokens of a sampling step; the executor rewinds
// the rejected ones, so the next step starts after the accepted ones, with the history cut.
TEST(SequenceStates, ProposalsAreCheckedAndRejectedOnesAreRewound) {
  SequenceStates states(kBlockSize, 16);
  SamplingParams penalised;
  penalised.repetition_penalty = 1.2f;
  ASSERT_TRUE(states.apply(plan_of(1, {start_step(7, {1, 2, 3}, {0}, penalised)})).is_ok());
  SeqStep spec = decode_step(7, 2, 3, 9, 1, {1});
  spec.tokens = {9, 4, 5, 6};  // the last token, then three proposals
  spec.num_draft = 3;
  const StepPlan plan = plan_of(2, {spec});  // the views point into it
  auto views = states.apply(plan);
  ASSERT_TRUE(views.is_ok()) << views.status().to_string();
  EXPECT_EQ((*views)[0].num_generated(), 1);  // the token sampled at the last token's row
  states.rewind(7, 2);                        // proposal 4 accepted, 5 and 6 rejected
  EXPECT_EQ(states.find(7)->num_fed, 5);
  EXPECT_EQ(states.find(7)->history, (std::vector<int32_t>{1, 2, 3, 9, 4}));
  SeqStep stale = decode_step(7, 3, 7, 8, 2);
  expect_refusal(states, plan_of(3, {stale}), "num_computed 7 but 5 tokens were fed here");
  ASSERT_TRUE(states.apply(plan_of(3, {decode_step(7, 3, 5, 8, 2)})).is_ok());

  SeqStep too_many = decode_step(7, 4, 6, 1, 2);
  too_many.tokens = {1, 2};
  too_many.num_draft = 2;
  expect_refusal(states, plan_of(4, {too_many}), "2 proposals among 2 tokens");
  SeqStep masked = decode_step(7, 4, 6, 1, 2);
  masked.tokens = {1, 2};
  masked.num_draft = 1;
  masked.allowed_tokens = {0xffffffffu, 0xffffffffu, 0xffffffffu};
  expect_refusal(states, plan_of(4, {masked}), "3 mask words do not split into a mask for each of the 2 checked rows");
  SeqStep unsampled = masked;
  unsampled.allowed_tokens.clear();
  unsampled.sample = false;
  expect_refusal(states, plan_of(4, {unsampled}), "proposals need a sampling step");
  SeqStep huge = decode_step(7, 4, 6, 1, 2, {2, 3, 4, 5, 6});
  huge.tokens.assign(SeqStep::kMaxDraft + 2, 1);
  huge.num_draft = SeqStep::kMaxDraft + 1;
  expect_refusal(states, plan_of(4, {huge}), "at most 16");
}

}  // namespace
}  // namespace tessera
