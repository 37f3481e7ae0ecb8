#include "coordinator/engine/structured/sequence_constraint.h"

#include <algorithm>

namespace tessera::structured {

SequenceConstraint::SequenceConstraint(std::shared_ptr<const TokenConstraint> constraint, std::vector<int32_t> end_tokens)
    : constraint_(std::move(constraint)), end_tokens_(std::move(end_tokens)), state_(constraint_->initial()) {}

const std::vector<uint32_t>& SequenceConstraint::next_mask() {
  prepare_mask_until(std::chrono::steady_clock::time_point::max());
  return mask_;
}

namespace {

// Where the grammar may end, the end tokens join a mask the grammar filled.
void add_end_tokens(const TokenConstraint& grammar, const MatchState& state, const std::vector<int32_t>& end_tokens,
                    std::vector<uint32_t>* mask) {
  if (!grammar.can_end(state)) return;
  for (int32_t t : end_tokens) {
    if (t < 0) continue;
    const auto id = static_cast<size_t>(t);
    if (mask->size() <= id / 32) mask->resize(id / 32 + 1, 0);
    (*mask)[id / 32] |= 1u << (id % 32);
  }
}

}  // namespace

bool mask_after_until(const TokenConstraint& grammar, const MatchState& state, const std::vector<int32_t>& end_tokens,
                      std::vector<uint32_t>* mask, std::chrono::steady_clock::time_point deadline) {
  if (!grammar.fill_mask_until(state, mask, deadline)) return false;
  add_end_tokens(grammar, state, end_tokens, mask);
  return true;
}

bool SequenceConstraint::prepare_mask_until(std::chrono::steady_clock::time_point deadline) {
  if (mask_ready_) return true;
  mask_ready_ = mask_after_until(*constraint_, state_, end_tokens_, &mask_, deadline);
  return mask_ready_;
}

bool SequenceConstraint::take_cached_mask() {
  if (mask_ready_) return true;
  if (!constraint_->cached_mask(state_, &mask_)) return false;
  add_end_tokens(*constraint_, state_, end_tokens_, &mask_);
  mask_ready_ = true;
  return true;
}

ConstraintVerdict SequenceConstraint::on_token(int32_t token, std::string* error) {
  const ConstraintVerdict verdict = advance(token, error);
  if (verdict != ConstraintVerdict::kContinue) return verdict;
  prepare_mask();
  return check_mask(error);
}

ConstraintStep step_constraint(const TokenConstraint& grammar, const MatchState& state,
                               const std::vector<int32_t>& end_tokens, int32_t token) {
  return *step_constraint_until(grammar, state, end_tokens, token, std::chrono::steady_clock::time_point::max());
}

std::optional<ConstraintStep> step_constraint_until(const TokenConstraint& grammar, const MatchState& state,
                                                    const std::vector<int32_t>& end_tokens, int32_t token,
                                                    std::chrono::steady_clock::time_point deadline) {
  ConstraintStep step;
  if (std::find(end_tokens.begin(), end_tokens.end(), token) != end_tokens.end()) {
    if (grammar.can_end(state)) {
      step.verdict = ConstraintVerdict::kComplete;
    } else {
      step.verdict = ConstraintVerdict::kViolated;
      step.error = "structured output: token " + std::to_string(token) + " ends the output where the grammar cannot end";
    }
    return step;
  }
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    step.next = grammar.advance_token(state, token);
  } else {
    std::optional<MatchState> next = grammar.advance_token_until(state, token, deadline);
    if (!next) return std::nullopt;
    step.next = std::move(*next);
  }
  if (grammar.is_dead(step.next)) {
    step.verdict = ConstraintVerdict::kViolated;
    step.error = "structured output: token " + std::to_string(token) + " is not allowed by the grammar here" +
                 (grammar.exhausted() ? " (the grammar's parse stacks outgrew their memory bound)" : "");
  } else if (grammar.must_end(step.next)) {
    step.verdict = ConstraintVerdict::kComplete;
  }
  return step;
}

ConstraintVerdict SequenceConstraint::advance(int32_t token, std::string* error) {
  return apply(step_constraint(*constraint_, state_, end_tokens_, token), error);
}

std::optional<ConstraintVerdict> SequenceConstraint::advance_until(int32_t token,
                                                                   std::chrono::steady_clock::time_point deadline,
                                                                   std::string* error) {
  std::optional<ConstraintStep> step = step_constraint_until(*constraint_, state_, end_tokens_, token, deadline);
  if (!step) return std::nullopt;
  return apply(std::move(*step), error);
}

ConstraintVerdict SequenceConstraint::apply(ConstraintStep step, std::string* error) {
  mask_ready_ = false;
  if (step.verdict == ConstraintVerdict::kViolated) {
    *error = std::move(step.error);
    return step.verdict;
  }
  // A completing end token leaves the state as it was (nothing follows it).
  if (!step.next.stacks.empty()) state_ = std::move(step.next);
  return step.verdict;
}

ConstraintVerdict SequenceConstraint::check_mask(std::string* error) {
  // A dead end for this vocabulary (no token continues, and the grammar may not end here)
  // is an error now, not a token drawn outside the mask later.
  const std::vector<uint32_t>& mask = next_mask();
  if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; })) {
    *error = kNoTokenContinues;
    return ConstraintVerdict::kViolated;
  }
  return ConstraintVerdict::kContinue;
}

}  // namespace tessera::structured
