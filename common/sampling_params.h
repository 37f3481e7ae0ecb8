#pragma once
// How one request wants its tokens chosen. Travels with the request from the API through
// the scheduler to the executor that samples (rank 0), so it lives in common/.
#include <cstdint>
#include <optional>

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

  // The penalties read the sequence's token history (prompt + output), so only then do the
  // executors keep it.
  bool has_penalty() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

}  // namespace tessera
