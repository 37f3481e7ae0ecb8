#pragma once
// The seam between the scheduler (coordinator) and the executors (workers): one StepPlan
// in, one StepResult out, per step. Plain structs, no transport: in-process they are passed
// by reference; between processes they are encoded by the wire protocol.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/sampling_params.h"

namespace tessera {

using SeqId = uint64_t;

// One sequence's share of a step: a prefill chunk or one decode token.
struct SeqStep {
  SeqId seq_id = 0;
  std::vector<int32_t> tokens;       // the new tokens fed this step
  int32_t num_computed = 0;          // tokens already in the KV cache; new ones take positions from here
  // Every block the sequence owns, in order (covers num_computed + tokens). With a sliding
  // window the leading blocks wholly before the first new token's window are -1 (freed).
  std::vector<int32_t> block_table;
  // True when this step reaches the end of the known tokens, so a next token must be sampled
  // (false for all but the last chunk of a chunked prefill).
  bool sample = false;
  SamplingParams sampling;
  // Sampling state that must survive preemption and travel with the plan: the index of the
  // token being generated (the counter of the seeded generator), and the tokens the
  // penalties look at.
  int32_t num_generated = 0;
  std::vector<int32_t> penalty_tokens;  // prompt + output so far, only when a penalty is set
  int32_t penalty_prompt_len = 0;       // how many of penalty_tokens are prompt
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<SeqStep> seqs;
  // Copy-on-write: copy KV block `first` into block `second` before running the step.
  std::vector<std::pair<int32_t, int32_t>> block_copies;
  // Return the raw logits of the sampled rows in StepResult::logits (--dump-logits and
  // reference comparisons; every rank computes them, rank 0 returns them).
  bool return_logits = false;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  SeqId seq_id = 0;
  int32_t token = 0;
  float logprob = 0.0f;                  // log-softmax of the chosen token (temperature 1 logits)
  std::vector<TokenLogprob> top_logprobs;  // when sampling.logprobs > 0
};

struct StepResult {
  uint64_t step_id = 0;
  std::vector<SampledToken> tokens;  // one per SeqStep with sample == true, in plan order
  std::string error;                 // empty on success
  std::vector<float> logits;         // [tokens.size(), vocab] when the plan asked for them
};

}  // namespace tessera
