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
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/engine/structured/token_constraint.h"

namespace tessera::structured {

enum class ConstraintVerdict { kContinue, kComplete, kViolated };

// The error of a grammar state no token of the vocabulary can continue (where it may not end).
inline constexpr const char* kNoTokenContinues = "structured output: no token of the vocabulary can continue the grammar here";

// What one token does to a grammar state: computed anywhere (it reads only the grammar, which
// is thread-safe), applied to the sequence's constraint on the engine thread.
struct ConstraintStep {
  MatchState next;
  ConstraintVerdict verdict = ConstraintVerdict::kContinue;
  std::string error;  // for kViolated
};
ConstraintStep step_constraint(const TokenConstraint& grammar, const MatchState& state,
                               const std::vector<int32_t>& end_tokens, int32_t token);
// step_constraint, unless another thread's walk of the grammar holds it past `deadline`.
std::optional<ConstraintStep> step_constraint_until(const TokenConstraint& grammar, const MatchState& state,
                                                    const std::vector<int32_t>& end_tokens, int32_t token,
                                                    std::chrono::steady_clock::time_point deadline);

// The mask of the token after `state`: the grammar's tokens, plus `end_tokens` where it may end.
// False, the mask unfinished, when `deadline` passes first (another call goes on from what the
// grammar cached). For proposals checked ahead of the sequence's own state (speculative decoding).
bool mask_after_until(const TokenConstraint& grammar, const MatchState& state, const std::vector<int32_t>& end_tokens,
                      std::vector<uint32_t>* mask, std::chrono::steady_clock::time_point deadline);

class SequenceConstraint {
 public:
  // `end_tokens`: the ids that end the choice (eos unless ignore_eos, stop_token_ids), allowed
  // exactly where the grammar may end.
  SequenceConstraint(std::shared_ptr<const TokenConstraint> constraint, std::vector<int32_t> end_tokens);

  // Bitset of the tokens allowed next (common/step_plan.h SeqStep::allowed_tokens); computed
  // now unless prepare_mask() already did.
  const std::vector<uint32_t>& next_mask();
  // Computes the next mask unless `deadline` passes first (false; call again to go on).
  bool prepare_mask_until(std::chrono::steady_clock::time_point deadline);
  // Takes the next mask from the grammar's cache when it is there (a MaskWarmer finished it);
  // never waits for a walk.
  bool take_cached_mask();
  bool mask_ready() const { return mask_ready_; }
  const std::shared_ptr<const TokenConstraint>& grammar() const { return constraint_; }
  ConstraintVerdict on_token(int32_t token, std::string* error);

  // on_token() in parts. kContinue from advance() means the grammar goes on, pending its mask.
  ConstraintVerdict advance(int32_t token, std::string* error);
  // advance, unless the grammar is busy past `deadline` (nullopt: nothing changed).
  std::optional<ConstraintVerdict> advance_until(int32_t token, std::chrono::steady_clock::time_point deadline,
                                                 std::string* error);
  // advance() with its step computed elsewhere (step_constraint from this state).
  ConstraintVerdict apply(ConstraintStep step, std::string* error);
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
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
