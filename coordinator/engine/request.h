#pragma once
// Request: the one immutable, wire-facing description of a generation, built once by
// whoever receives it (the OpenAI layer from JSON, tessera-generate from its flags) and
// shared from there on (std::shared_ptr<const Request>) by the EngineService, the Engine and
// the Scheduler; nothing downstream copies or rewrites it. The engine's mutable state for
// it is Sequence (coordinator/engine/sequence.h): one per choice.
//
// One id end to end: the RequestId that EngineService::submit returns (or the caller of
// Engine::add_request chose) is what the scheduler, the step plans and the workers call the
// request's sequence. With n > 1 choices, choice 0 keeps that id and choice c > 0 is the
// sequence choice_seq_id(id, c) (the choice in the id's top byte), so a sequence id always
// names its request and choice without a map.
//
// validate_request() is the one place a request's contents are checked against what the
// engine can run; the EngineService (before queuing) and the Scheduler (at admission) call
// it with their limits.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/sampling_params.h"
#include "common/status.h"
#include "common/step_plan.h"  // SeqId

namespace tessera {

namespace structured {
class TokenConstraint;
}  // namespace structured

using RequestId = SeqId;

// Choices per request (OpenAI's "n"). Choice c of request r is sequence choice_seq_id(r, c).
inline constexpr int kMaxChoices = 128;
inline constexpr int kChoiceShift = 56;
inline constexpr RequestId kMaxRequestId = (RequestId{1} << kChoiceShift) - 1;

inline SeqId choice_seq_id(RequestId id, int choice) { return id | (static_cast<SeqId>(choice) << kChoiceShift); }
inline RequestId request_of(SeqId seq) { return seq & kMaxRequestId; }
inline int choice_of(SeqId seq) { return static_cast<int>(seq >> kChoiceShift); }

struct StopConditions {
  std::optional<int32_t> eos_token_id;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
};

// Whether `token` ends a choice by these conditions: the EOS (unless ignore_eos) or a stop id.
inline bool is_stop_token(const StopConditions& stop, int32_t token) {
  if (!stop.ignore_eos && stop.eos_token_id && token == *stop.eos_token_id) return true;
  for (int32_t t : stop.stop_token_ids)
    if (t == token) return true;
  return false;
}

struct Request {
  std::vector<int32_t> prompt;        // already tokenized (special tokens included as wanted)
  SamplingParams sampling;            // choice c draws with choice_sampling(c)
  int max_tokens = 16;                // new tokens per choice
  // Choices sampled from the one prompt: its prefill runs once and the sequence is forked
  // (KV blocks shared copy-on-write) before the first token is sampled.
  int n = 1;
  StopConditions stop;                // eos handling and stop token ids
  std::vector<std::string> stop_strings;  // text that ends a choice's output (not emitted, unless:)
  bool include_stop_str_in_output = false;  // vLLM: the matched stop string ends the text
  int priority = 0;                   // lower runs sooner
  bool skip_special_tokens = true;    // in the text deltas
  // false: this request's choices never carry speculative proposals (speculative.method
  // applies to the others); the tokens are the same either way.
  bool speculative = true;
  // Structured output (compiled by coordinator/api/grammars/, matched by
  // coordinator/engine/structured/; docs/structured-output.md): every choice's output is a
  // string of this grammar — each sampled token is drawn from the tokens it allows, the end
  // tokens only where it may end, and the choice stops ("stop") when it is complete. Null =
  // unconstrained.
  std::shared_ptr<const structured::TokenConstraint> constraint;
  // Not kNone: an embedding request — its prompt is computed (prefill only, batched with the
  // generating ones) and it ends with the pooled final hidden state (SequenceEvent::embedding)
  // and no output tokens; n is 1 and max_tokens is not used.
  Pooling pooling = Pooling::kNone;
  // The LoRA adapter the request runs with, by its served name (empty: the base model). The
  // caller checks the name against what the executors hold (a step naming an adapter they
  // lack fails); the prefix cache shares KV only between requests of the same adapter.
  std::string lora;

  // Choice c of a seeded request draws with seed + c (what separate requests seeded
  // seed, seed + 1, ... would draw); an unseeded one is seeded by the scheduler per sequence.
  // min_tokens_stop_ids is filled from `stop`, and only choice 0 asks prompt logprobs.
  SamplingParams choice_sampling(int choice) const;
};

// A shareable Request of these fields (n = 1), for tools, benchmarks and tests.
std::shared_ptr<const Request> make_request(std::vector<int32_t> prompt, int max_tokens, SamplingParams sampling = {},
                                            StopConditions stop = {}, int priority = 0);

// What a request is checked against. 0 / false = that check is off.
struct RequestLimits {
  int max_model_len = 0;           // prompt + 1 must fit (room for one generated token)
  // Longest prompt + output a sequence can reach (max_model_len capped by the KV pool and,
  // without chunked prefill, by the token budget): the prompt + 1 must fit.
  int max_sequence_len = 0;
  // Refuse (rather than cut at "length") a prompt + max_tokens over max_sequence_len: what
  // an API caller asked for must be what it can get.
  bool max_tokens_must_fit = false;
  int64_t vocab_size = 0;          // prompt ids must lie in [0, vocab_size)
  int block_size = 0;              // with num_blocks: the prompt + 1 must fit the KV pool
  int num_blocks = 0;
  bool chunked_prefill = true;     // off: the prompt must fit max_num_batched_tokens
  int max_num_batched_tokens = 0;
};

// The limit max_sequence_len stands for, in words ("max_model_len 2048", "the 1024 tokens the
// whole KV pool holds (...)"), for messages.
std::string sequence_limit_name(const RequestLimits& limits);
// InvalidArgument naming the field (prompt, prompt[i], max_tokens, n, min_tokens, logit_bias,
// sampling fields) and the limit it breaks.
Status validate_request(const Request& request, const RequestLimits& limits);
Status validate_sampling(const SamplingParams& sampling);

}  // namespace tessera
