#include "coordinator/request.h"

#include <cmath>
#include <utility>

namespace tessera {

SamplingParams Request::choice_sampling(int choice) const {
  SamplingParams s = sampling;
  if (s.seed) s.seed = *s.seed + static_cast<uint64_t>(choice);
  return s;
}

std::shared_ptr<const Request> make_request(std::vector<int32_t> prompt, int max_tokens, SamplingParams sampling,
                                            StopConditions stop, int priority) {
  auto r = std::make_shared<Request>();
  r->prompt = std::move(prompt);
  r->max_tokens = max_tokens;
  r->sampling = std::move(sampling);
  r->stop = std::move(stop);
  r->priority = priority;
  return r;
}

Status validate_sampling(const SamplingParams& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f)
    return invalid_argument("temperature must be >= 0, got " + std::to_string(s.temperature));
  if (s.top_k < 0) return invalid_argument("top_k must be >= 0, got " + std::to_string(s.top_k));
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return invalid_argument("top_p must be in (0, 1], got " + std::to_string(s.top_p));
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
    return invalid_argument("min_p must be in [0, 1], got " + std::to_string(s.min_p));
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty))
    return invalid_argument("repetition_penalty must be > 0, got " + std::to_string(s.repetition_penalty));
  if (!std::isfinite(s.presence_penalty) || !std::isfinite(s.frequency_penalty))
    return invalid_argument("presence_penalty and frequency_penalty must be finite");
  if (s.logprobs < 0 || s.logprobs > 20)
    return invalid_argument("logprobs must be in [0, 20], got " + std::to_string(s.logprobs));
  return Status::ok();
}

// Which limit max_sequence_len is, for messages: the context length, the KV pool (a
// sequence can never hold more blocks than the pool has) or the token budget.
std::string sequence_limit_name(const RequestLimits& l) {
  const std::string n = std::to_string(l.max_sequence_len);
  if (l.max_model_len > 0 && l.max_sequence_len >= l.max_model_len) return "max_model_len " + n;
  const int64_t pool_tokens = int64_t{l.block_size} * l.num_blocks;
  if (pool_tokens > 0 && l.max_sequence_len == pool_tokens) {
    return "the " + n + " tokens the whole KV pool holds (" + std::to_string(l.num_blocks) + " blocks of " +
           std::to_string(l.block_size) + " tokens: cache.num_blocks, cache.cpu_kv_bytes, cache.memory_fraction)";
  }
  if (!l.chunked_prefill && l.max_sequence_len == l.max_num_batched_tokens) {
    return "scheduler.max_num_batched_tokens " + n + " (scheduler.chunked_prefill is off)";
  }
  return "the longest sequence the engine runs (" + n + " tokens)";
}

Status validate_request(const Request& r, const RequestLimits& l) {
  if (r.prompt.empty()) return invalid_argument("empty prompt");
  if (r.max_tokens < 1) return invalid_argument("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  if (r.n < 1 || r.n > kMaxChoices)
    return invalid_argument("n must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(r.n));
  const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
  const std::string len = std::to_string(prompt_len);
  if (l.max_tokens_must_fit && l.max_sequence_len > 0 && prompt_len + r.max_tokens > l.max_sequence_len) {
    return invalid_argument("prompt (" + len + " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
                            ") = " + std::to_string(prompt_len + r.max_tokens) + " exceeds " +
                            sequence_limit_name(l));
  }
  const int64_t need = prompt_len + 1;  // the prompt plus one generated token
  if (l.max_model_len > 0 && need > l.max_model_len)
    return invalid_argument("prompt of " + len + " tokens leaves no room to generate within max_model_len " +
                            std::to_string(l.max_model_len));
  if (l.block_size > 0 && l.num_blocks > 0) {
    const int64_t blocks = (need + l.block_size - 1) / l.block_size;
    if (blocks > l.num_blocks)
      return invalid_argument("prompt of " + len + " tokens needs " + std::to_string(blocks) +
                              " KV blocks but the cache has only " + std::to_string(l.num_blocks) + " of " +
                              std::to_string(l.block_size) + " tokens");
  }
  if (!l.chunked_prefill && l.max_num_batched_tokens > 0 && need > l.max_num_batched_tokens)
    return invalid_argument("prompt of " + len + " tokens does not fit max_num_batched_tokens " +
                            std::to_string(l.max_num_batched_tokens) + " without chunked prefill");
  if (l.max_sequence_len > 0 && need > l.max_sequence_len)
    return invalid_argument("prompt of " + len + " tokens does not fit the longest sequence the engine runs (" +
                            std::to_string(l.max_sequence_len) + " tokens)");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    const int32_t t = r.prompt[i];
    if (t < 0 || (l.vocab_size > 0 && t >= l.vocab_size)) {
      return invalid_argument("prompt[" + std::to_string(i) + "] = " + std::to_string(t) +
                              " is outside the vocabulary of " + std::to_string(l.vocab_size) + " tokens");
    }
  }
  return validate_sampling(r.sampling);
}

}  // namespace tessera
