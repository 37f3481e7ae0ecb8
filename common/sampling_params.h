#pragma once
// How one request wants its tokens chosen. Travels with the request from the API through
// the scheduler to the executor that samples (rank 0), so it lives in common/.
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace tessera {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (ties to the lowest id)
  int top_k = 0;             // 0 = whole vocabulary
  float top_p = 1.0f;        // nucleus mass kept
  float min_p = 0.0f;        // drop tokens below min_p × p(top token)
  float repetition_penalty = 1.0f;  // >1 discourages tokens seen in prompt or output (HF/CTRL style)
  float presence_penalty = 0.0f;    // OpenAI: subtract once if the token appeared in the output
  float frequency_penalty = 0.0f;   // OpenAI: subtract × count in the output
  // A seeded request draws from a counter-based generator keyed by (seed, token index), so it
  // produces the same tokens whatever else shares its batch. Unseeded requests get a seed
  // from the coordinator.
  std::optional<uint64_t> seed;
  int logprobs = 0;  // how many top alternatives to return with each token (0 = only its own)
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logits before any other
  // processing (penalties, temperature, top-k/p); sorted by id, each id once. -100 all but bans
  // the token. The reported logprobs stay those of the raw model output.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's min_tokens: until this many tokens were generated, the ids in min_tokens_stop_ids
  // (eos unless ignore_eos, and stop_token_ids; Request::choice_sampling fills them) get
  // logit -inf, so they cannot be sampled, and nothing (no stop token, no stop string) ends
  // the choice before then.
  int min_tokens = 0;
  std::vector<int32_t> min_tokens_stop_ids;
  // Prompt logprobs (echo + logprobs on /v1/completions): >= 0 asks the executor for the
  // logprob of every prompt token given its prefix, with this many top alternatives; -1 = none
  // (then a prefill computes logits only for the rows it samples from).
  int prompt_logprobs = -1;

  // The penalties read the sequence's token history (prompt + output), so only then do the
  // executors keep it.
  bool has_penalty() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

}  // namespace tessera
