#pragma once
// One sequence's place in its grammar, owned by the scheduler's Sequence: the mask its next
// sampled token must fall in (computed when the previous token is applied, so before the
// step that samples is planned — the mask never waits on the forward pass), and what a
// sampled token does to it: go on, complete the grammar (the choice ends with "stop"), or
// break it (only when the sampler was handed no allowed token; the choice ends with an error).
//
// A step applies its tokens in three parts so that the costly one runs in parallel over the
// step's sequences (Scheduler::on_step_result, mask_pool.h): advance() on the engine thread
// (a few memoized byte steps), prepare_mask() on any thread (the trie walk when the state is
// new; different SequenceConstraints may run it at once), then check_mask() on the engine
// thread. on_token() does the three in a row.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/engine/structured/token_constraint.h"

namespace tessera::structured {

enum class ConstraintVerdict { kContinue, kComplete, kViolated };

class SequenceConstraint {
 public:
  // `end_tokens`: the ids that end the choice (eos unless ignore_eos, stop_token_ids), allowed
  // exactly where the grammar may end.
  SequenceConstraint(std::shared_ptr<const TokenConstraint> constraint, std::vector<int32_t> end_tokens);

  // Bitset of the tokens allowed next (common/step_plan.h SeqStep::allowed_tokens); computed
  // now unless prepare_mask() already did.
  const std::vector<uint32_t>& next_mask();
  ConstraintVerdict on_token(int32_t token, std::string* error);

  // on_token() in parts. kContinue from advance() means the grammar goes on, pending its mask.
  ConstraintVerdict advance(int32_t token, std::string* error);
  void prepare_mask() { (void)next_mask(); }
  // kViolated when no token of the vocabulary can continue (and the grammar may not end).
  ConstraintVerdict check_mask(std::string* error);
  const MatchState& state() const { return state_; }

 private:
  std::shared_ptr<const TokenConstraint> constraint_;
  std::vector<int32_t> end_tokens_;
  MatchState state_;
  std::vector<uint32_t> mask_;
  bool mask_ready_ = false;
};

}  // namespace tessera::structured
