#pragma once
// The executor's side of step deltas (common/step_plan.h): the state each running sequence
// left on this executor — its block table, sampling parameters, how many tokens were fed,
// the token history when a penalty needs it — and the one place a plan's deltas are checked
// and applied. The worker's executor and the test executors share it, so what a delta means
// is decided once.
//
//   SequenceStates states(block_size, num_blocks);
//   StatusOr<std::vector<SeqView>> views = states.apply(plan);  // refused plans change nothing
//   for (const SeqView& v : *views) ... v.state->block_table ... v.num_generated() ...
//
// Not thread-safe: one executor thread applies plans.
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/step_plan.h"

namespace tessera {

// What this executor holds for one sequence between its steps.
struct HeldSequence {
  uint32_t version = 0;           // of the last step applied
  int32_t num_fed = 0;            // tokens fed so far (num_computed + tokens of the last step)
  int32_t num_draft = 0;          // of those, the last step's proposals (until rewind())
  std::vector<int32_t> block_table;  // -1 for the leading entries a sliding window released
  int32_t num_released = 0;
  SamplingParams sampling;
  int32_t prompt_len = 0;
  // Every token fed so far, kept only when a penalty is set (sampling.has_penalty()).
  std::vector<int32_t> history;
  // The whole prompt, kept only when sampling.prompt_logprobs >= 0 (the targets of its rows).
  std::vector<int32_t> prompt;
  Pooling pooling = Pooling::kNone;  // an embedding sequence's (SeqStart::pooling)
  std::string lora;                  // its LoRA adapter's name (SeqStart::lora); empty: none
};

// One step of a plan with the state of its sequence (after the step was applied).
struct SeqView {
  const SeqStep* step = nullptr;
  const HeldSequence* state = nullptr;
  // The index of the token this step samples: tokens generated before it. With proposals,
  // the index of the first one sampled (at the row before the proposals).
  int32_t num_generated() const { return state->num_fed - state->num_draft - state->prompt_len; }
  // The sequence whose logits row this step samples from (its parent, on a forked choice's
  // first step), else 0: its own last token's row.
  SeqId sample_from() const { return step->start ? step->start->sample_from : 0; }
  // What the penalties read: prompt + output so far (empty without a penalty).
  const std::vector<int32_t>& penalty_tokens() const { return state->history; }
};

class SequenceStates {
 public:
  // Blocks hold `block_size` tokens (0 = table sizes unchecked); block ids must lie in
  // [0, num_blocks) (0 = unchecked).
  SequenceStates(int block_size, int num_blocks) : block_size_(block_size), num_blocks_(num_blocks) {}

  // Forgets the plan's dropped sequences, then applies every step, after checking them all:
  // a delta for a sequence this executor does not hold, a version that does not follow the
  // held one, a num_computed other than the tokens fed so far, a starting step without its
  // state (or a later one with it), a sequence twice in one plan, a table change out of
  // range, a block outside the pool, or a table that cannot hold the step's tokens is an
  // InvalidArgument naming the step and sequence, and then nothing changes. A step with no
  // tokens is refused unless it starts a forked choice sampling from (start.sample_from) an
  // earlier step of the plan that feeds tokens, samples, and ends where it begins. The views are
  // in plan order and stay valid until the next apply().
  StatusOr<std::vector<SeqView>> apply(const StepPlan& plan);

  // Forgets the last `num_rejected` tokens fed to a sequence of the last plan: proposals
  // (SeqStep::num_draft) its step rejected, whose KV the next step overwrites.
  void rewind(SeqId id, int32_t num_rejected);
  const HeldSequence* find(SeqId id) const;
  size_t size() const { return states_.size(); }
  void clear() { states_.clear(); }

 private:
  Status check(const StepPlan& plan) const;

  int block_size_;
  int num_blocks_;
  std::unordered_map<SeqId, HeldSequence> states_;
};

}  // namespace tessera
