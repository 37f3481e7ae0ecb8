#include "coordinator/engine/structured/sequence_constraint.h"

#include <algorithm>

namespace tessera::structured {

SequenceConstraint::SequenceConstraint(std::shared_ptr<const TokenConstraint> constraint, std::vector<int32_t> end_tokens)
    : constraint_(std::move(constraint)), end_tokens_(std::move(end_tokens)), state_(constraint_->initial()) {}

const std::vector<uint32_t>& SequenceConstraint::next_mask() {
  if (mask_ready_) return mask_;
  constraint_->fill_mask(state_, &mask_);
  if (constraint_->can_end(state_)) {
    for (int32_t t : end_tokens_) {
      if (t < 0) continue;
      const auto id = static_cast<size_t>(t);
      if (mask_.size() <= id / 32) mask_.resize(id / 32 + 1, 0);
      mask_[id / 32] |= 1u << (id % 32);
    }
  }
  mask_ready_ = true;
  return mask_;
}

ConstraintVerdict SequenceConstraint::on_token(int32_t token, std::string* error) {
  const ConstraintVerdict verdict = advance(token, error);
  if (verdict != ConstraintVerdict::kContinue) return verdict;
  prepare_mask();
  return check_mask(error);
}

ConstraintVerdict SequenceConstraint::advance(int32_t token, std::string* error) {
  mask_ready_ = false;
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) {
    if (constraint_->can_end(state_)) return ConstraintVerdict::kComplete;
    *error = "structured output: token " + std::to_string(token) + " ends the output where the grammar cannot end";
    return ConstraintVerdict::kViolated;
  }
  MatchState next = constraint_->advance_token(state_, token);
  if (constraint_->is_dead(next)) {
    *error = "structured output: token " + std::to_string(token) + " is not allowed by the grammar here" +
             (constraint_->exhausted() ? " (the grammar's parse stacks outgrew their memory bound)" : "");
    return ConstraintVerdict::kViolated;
  }
  state_ = std::move(next);
  if (constraint_->must_end(state_)) return ConstraintVerdict::kComplete;
  return ConstraintVerdict::kContinue;
}

ConstraintVerdict SequenceConstraint::check_mask(std::string* error) {
  // A dead end for this vocabulary (no token continues, and the grammar may not end here)
  // is an error now, not a token drawn outside the mask later.
  const std::vector<uint32_t>& mask = next_mask();
  if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; })) {
    *error = "structured output: no token of the vocabulary can continue the grammar here";
    return ConstraintVerdict::kViolated;
  }
  return ConstraintVerdict::kContinue;
}

}  // namespace tessera::structured
