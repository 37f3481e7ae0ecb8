#pragma once
// Sequence: the scheduler's mutable state for one choice of a request (the immutable
// Request it runs is shared, see coordinator/engine/request.h). States are listed in the order a
// sequence passes through them; preemption by recompute sends a running sequence back to
// kWaiting with its generated tokens kept, to be prefilled again as prompt + output.
//
// A request with n > 1 choices starts as one sequence (choice 0) that is to fork: the step
// that computes its last prompt token forks it into n sequences sharing its KV blocks, and
// each child samples its first token, with its own seed, from the logits that step yields
// (SeqStart::sample_from), exactly as a separate request would: the prompt is computed once.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/sampling_params.h"
#include "common/step_plan.h"
#include "coordinator/engine/request.h"
#include "coordinator/engine/structured/sequence_constraint.h"

namespace tessera {

enum class SequenceState : uint8_t {
  kWaiting,   // queued (new, or preempted); owns no KV blocks
  kPrefill,   // running; some known tokens are not in the KV cache yet
  kDecode,    // running; everything but the last sampled token is in the KV cache
  kFinished,  // see FinishReason
};

enum class FinishReason : uint8_t {
  kNone,     // not finished
  kLength,   // max_new_tokens reached (or the model/cache length limit)
  kStop,     // eos (unless ignore_eos) or one of stop_token_ids was sampled (it is kept in the output)
  kAborted,  // the client went away or cancelled
  kError,    // the step failed
};

const char* sequence_state_name(SequenceState state);
const char* finish_reason_name(FinishReason reason);

class Sequence {
 public:
  // Choice choice_of(id) of `request`, drawing with `sampling` (the request's choice
  // sampling, seeded). Choice 0 of a request with n > 1 starts as the one to fork.
  Sequence(SeqId id, std::shared_ptr<const Request> request, SamplingParams sampling, uint64_t arrival);

  SeqId id() const { return id_; }
  RequestId request_id() const { return request_of(id_); }
  int choice() const { return choice_of(id_); }
  const Request& request() const { return *request_; }
  SequenceState state() const { return state_; }
  FinishReason finish_reason() const { return finish_reason_; }
  bool is_running() const { return state_ == SequenceState::kPrefill || state_ == SequenceState::kDecode; }
  bool is_finished() const { return state_ == SequenceState::kFinished; }

  // Prompt then generated tokens: what a (re)computation feeds.
  std::span<const int32_t> token_ids() const { return token_ids_; }
  std::span<const int32_t> prompt_ids() const { return token_ids().first(prompt_len_); }
  std::span<const int32_t> output_ids() const { return token_ids().subspan(prompt_len_); }
  int num_tokens() const { return static_cast<int>(token_ids_.size()); }
  int prompt_len() const { return prompt_len_; }
  int num_output() const { return num_tokens() - prompt_len_; }
  int num_computed() const { return num_computed_; }      // tokens whose KV is in the cache
  int num_uncomputed() const { return num_tokens() - num_computed_; }
  // Still to fork into the request's n choices (choice 0 of an n > 1 request, until then).
  bool fork_pending() const { return fork_pending_; }

  const SamplingParams& sampling() const { return sampling_; }
  int max_new_tokens() const { return request_->max_tokens; }
  const StopConditions& stop() const { return request_->stop; }
  int priority() const { return request_->priority; }  // lower runs sooner
  uint64_t arrival() const { return arrival_; }  // order of add_request, unique per request
  int num_preemptions() const { return num_preemptions_; }
  // (priority, arrival, choice): the order both queues and the preemption choice follow; a
  // request's choices keep its place.
  bool runs_before(const Sequence& other) const {
    if (priority() != other.priority()) return priority() < other.priority();
    if (arrival_ != other.arrival_) return arrival_ < other.arrival_;
    return choice() < other.choice();
  }

  // --- transitions, driven by the scheduler ---
  void start(int num_cached_tokens);             // kWaiting -> kPrefill, KV already holds a prefix
  void advance(int num_tokens);                  // these fed tokens are now in the KV cache
  void append_token(int32_t token);              // a sampled token; -> kDecode
  // Whether the last appended token ends the sequence; `max_len` caps prompt + output.
  FinishReason stop_reason(int max_len) const;
  void preempt();                                // running -> kWaiting, KV dropped
  void finish(FinishReason reason);
  // While the step computing the rest of the prompt is being scheduled (the parent is
  // running and has fed no output yet): choice `child_id` with the same tokens, all of them
  // counted as computed (that step writes them into the KV blocks the caller shares), drawing
  // with `sampling`. The fork is done for this sequence once every child is made (forked()).
  Sequence fork(SeqId child_id, SamplingParams sampling) const;
  void forked();

  // --- structured output (Request::constraint) ---
  // The mask the next sampled token must fall in; null when the request is unconstrained.
  const std::vector<uint32_t>* next_token_mask();
  // Moves the grammar on by the last appended token: kNone (go on), kStop (the grammar is
  // complete, or an end token came where it may end) or kError (*error says why). After a
  // kNone the next mask is still to compute: prepare_token_mask() (safe to run for different
  // sequences on different threads at once), then check_token_mask().
  FinishReason apply_constraint(std::string* error);
  // apply_constraint, unless its grammar is busy (another thread's walk) past `deadline`:
  // nullopt, and nothing changed.
  std::optional<FinishReason> apply_constraint_until(std::chrono::steady_clock::time_point deadline,
                                                     std::string* error);
  bool is_constrained() const { return constraint_.has_value(); }
  void prepare_token_mask();
  // prepare_token_mask, unless `deadline` passes first: false, and the mask is not ready (a
  // later call goes on from what this one cached).
  bool prepare_token_mask_until(std::chrono::steady_clock::time_point deadline);
  // The next mask from its grammar's cache when a MaskWarmer has finished it; never waits.
  bool take_cached_token_mask();
  // apply_constraint with the grammar's step by the last token computed elsewhere (a
  // MaskWarmer's step_constraint from mask_state(), before this sequence's grammar moved on).
  FinishReason apply_constraint_step(structured::ConstraintStep step, std::string* error);
  std::vector<int32_t> constraint_end_tokens() const;
  // Its grammar and the state whose mask is next (null grammar when unconstrained): what a
  // MaskWarmer computes off the engine thread.
  std::shared_ptr<const structured::TokenConstraint> mask_grammar() const;
  // Its grammar was found costly (TokenConstraint::costly); false when unconstrained.
  bool grammar_costly() const { return constraint_ && constraint_->grammar()->costly(); }
  structured::MatchState mask_state() const;
  // kError when no token can continue the grammar (a dead end for this vocabulary), else kNone.
  FinishReason check_token_mask(std::string* error);

 private:
  SeqId id_;
  std::shared_ptr<const Request> request_;
  std::vector<int32_t> token_ids_;  // the prompt copied once, then the output appended
  int prompt_len_;
  int num_computed_ = 0;
  SamplingParams sampling_;
  uint64_t arrival_;
  bool fork_pending_;
  int num_preemptions_ = 0;
  SequenceState state_ = SequenceState::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
  // Copied with the sequence when it forks: every choice starts from the grammar's start.
  std::optional<structured::SequenceConstraint> constraint_;
};

}  // namespace tessera
