#pragma once
// Sequence: the scheduler's mutable state for one request (the request itself — text,
// client, stream — lives with the API layer). States are listed in the order a sequence
// passes through them; preemption by recompute sends a running sequence back to kWaiting
// with its generated tokens kept, to be prefilled again as prompt + output.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/sampling_params.h"
#include "common/step_plan.h"

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

struct StopConditions {
  std::optional<int32_t> eos_token_id;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
};

class Sequence {
 public:
  Sequence(SeqId id, std::vector<int32_t> prompt, SamplingParams sampling, int max_new_tokens,
           StopConditions stop, int priority, uint64_t arrival);

  SeqId id() const { return id_; }
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

  const SamplingParams& sampling() const { return sampling_; }
  int max_new_tokens() const { return max_new_tokens_; }
  const StopConditions& stop() const { return stop_; }
  int priority() const { return priority_; }   // lower runs sooner
  uint64_t arrival() const { return arrival_; } // order of add_request, unique
  int num_preemptions() const { return num_preemptions_; }
  // (priority, arrival): the order both queues and the preemption choice follow.
  bool runs_before(const Sequence& other) const {
    return priority_ != other.priority_ ? priority_ < other.priority_ : arrival_ < other.arrival_;
  }

  // --- transitions, driven by the scheduler ---
  void start(int num_cached_tokens);             // kWaiting -> kPrefill, KV already holds a prefix
  void advance(int num_tokens);                  // these fed tokens are now in the KV cache
  void append_token(int32_t token);              // a sampled token; -> kDecode
  // Whether the last appended token ends the sequence; `max_len` caps prompt + output.
  FinishReason stop_reason(int max_len) const;
  void preempt();                                // running -> kWaiting, KV dropped
  void finish(FinishReason reason);

 private:
  SeqId id_;
  std::vector<int32_t> token_ids_;
  int prompt_len_;
  int num_computed_ = 0;
  SamplingParams sampling_;
  int max_new_tokens_;
  StopConditions stop_;
  int priority_;
  uint64_t arrival_;
  int num_preemptions_ = 0;
  SequenceState state_ = SequenceState::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
};

}  // namespace tessera
