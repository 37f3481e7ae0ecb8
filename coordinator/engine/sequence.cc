#include "coordinator/engine/sequence.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace tessera {

const char* sequence_state_name(SequenceState state) {
  switch (state) {
    case SequenceState::kWaiting: return "waiting";
    case SequenceState::kPrefill: return "prefill";
    case SequenceState::kDecode: return "decode";
    case SequenceState::kFinished: return "finished";
  }
  return "?";
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
  }
  return "?";
}

Sequence::Sequence(SeqId id, std::shared_ptr<const Request> request, SamplingParams sampling, uint64_t arrival)
    : id_(id),
      request_(std::move(request)),
      token_ids_(request_->prompt),
      prompt_len_(static_cast<int>(token_ids_.size())),
      sampling_(std::move(sampling)),
      arrival_(arrival),
      fork_pending_(request_->n > 1 && choice_of(id) == 0) {
  if (request_->constraint != nullptr) {
    std::vector<int32_t> end_tokens = request_->stop.stop_token_ids;
    if (!request_->stop.ignore_eos && request_->stop.eos_token_id) end_tokens.push_back(*request_->stop.eos_token_id);
    constraint_.emplace(request_->constraint, std::move(end_tokens));
  }
}

const std::vector<uint32_t>* Sequence::next_token_mask() {
  return constraint_ ? &constraint_->next_mask() : nullptr;
}

namespace {

FinishReason reason_of(structured::ConstraintVerdict verdict) {
  switch (verdict) {
    case structured::ConstraintVerdict::kContinue: return FinishReason::kNone;
    case structured::ConstraintVerdict::kComplete: return FinishReason::kStop;
    case structured::ConstraintVerdict::kViolated: return FinishReason::kError;
  }
  return FinishReason::kNone;
}

}  // namespace

FinishReason Sequence::apply_constraint(std::string* error) {
  if (!constraint_ || num_output() == 0) return FinishReason::kNone;
  return reason_of(constraint_->advance(token_ids_.back(), error));
}

std::optional<FinishReason> Sequence::apply_constraint_until(std::chrono::steady_clock::time_point deadline,
                                                             std::string* error) {
  if (!constraint_ || num_output() == 0) return FinishReason::kNone;
  const std::optional<structured::ConstraintVerdict> verdict = constraint_->advance_until(token_ids_.back(), deadline, error);
  if (!verdict) return std::nullopt;
  return reason_of(*verdict);
}

void Sequence::prepare_token_mask() {
  if (constraint_) constraint_->prepare_mask();
}

bool Sequence::prepare_token_mask_until(std::chrono::steady_clock::time_point deadline) {
  return !constraint_ || constraint_->prepare_mask_until(deadline);
}

bool Sequence::take_cached_token_mask() { return !constraint_ || constraint_->take_cached_mask(); }

FinishReason Sequence::apply_constraint_step(structured::ConstraintStep step, std::string* error) {
  if (!constraint_) return FinishReason::kNone;
  return reason_of(constraint_->apply(std::move(step), error));
}

std::vector<int32_t> Sequence::constraint_end_tokens() const {
  return constraint_ ? constraint_->end_tokens() : std::vector<int32_t>{};
}

std::shared_ptr<const structured::TokenConstraint> Sequence::mask_grammar() const {
  return constraint_ ? constraint_->grammar() : nullptr;
}

structured::MatchState Sequence::mask_state() const {
  return constraint_ ? constraint_->state() : structured::MatchState{};
}

FinishReason Sequence::check_token_mask(std::string* error) {
  return constraint_ ? reason_of(constraint_->check_mask(error)) : FinishReason::kNone;
}

Sequence Sequence::fork(SeqId child_id, SamplingParams sampling) const {
  TESSERA_CHECK(fork_pending_ && is_running() && num_output() == 0)
      << "sequence " << id_ << " forked outside its prefill";
  TESSERA_CHECK_EQ(request_of(child_id), request_id()) << "fork into another request's id";
  Sequence child = *this;
  child.id_ = child_id;
  child.sampling_ = std::move(sampling);
  child.fork_pending_ = false;
  child.num_preemptions_ = 0;
  child.num_computed_ = num_tokens();
  return child;
}

void Sequence::forked() {
  TESSERA_CHECK(fork_pending_) << "sequence " << id_ << " is not forking";
  fork_pending_ = false;
}

void Sequence::start(int num_cached_tokens) {
  TESSERA_CHECK(state_ == SequenceState::kWaiting) << "sequence " << id_ << " started while "
                                                   << sequence_state_name(state_);
  TESSERA_CHECK(num_cached_tokens >= 0 && num_cached_tokens < num_tokens())
      << "sequence " << id_ << ": at least one token must be computed for logits";
  num_computed_ = num_cached_tokens;
  state_ = SequenceState::kPrefill;
}

void Sequence::advance(int num_tokens) {
  TESSERA_CHECK(is_running()) << "sequence " << id_ << " advanced while " << sequence_state_name(state_);
  TESSERA_CHECK_LE(num_computed_ + num_tokens, this->num_tokens()) << "sequence " << id_;
  num_computed_ += num_tokens;
}

void Sequence::append_token(int32_t token) {
  TESSERA_CHECK_EQ(num_computed_, num_tokens()) << "sequence " << id_ << " sampled before its prefill ended";
  token_ids_.push_back(token);
  state_ = SequenceState::kDecode;
}

FinishReason Sequence::stop_reason(int max_len) const {
  if (num_output() == 0) return FinishReason::kNone;
  const int32_t last = token_ids_.back();
  const StopConditions& stop = request_->stop;
  // min_tokens: nothing but the length limits ends the choice before then (vLLM); the
  // sampler keeps eos and the stop token ids from being drawn until then.
  if (num_output() < request_->sampling.min_tokens) {
    if (num_output() >= max_new_tokens() || num_tokens() >= max_len) return FinishReason::kLength;
    return FinishReason::kNone;
  }
  if (is_stop_token(stop, last)) return FinishReason::kStop;
  if (num_output() >= max_new_tokens() || num_tokens() >= max_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

void Sequence::preempt() {
  TESSERA_CHECK(is_running()) << "sequence " << id_ << " preempted while " << sequence_state_name(state_);
  num_computed_ = 0;
  state_ = SequenceState::kWaiting;
  ++num_preemptions_;
}

void Sequence::finish(FinishReason reason) {
  TESSERA_CHECK(reason != FinishReason::kNone);
  state_ = SequenceState::kFinished;
  finish_reason_ = reason;
}

}  // namespace tessera
