#include "coordinator/engine/request.h"

#include <cmath>
#include <utility>

namespace tessera {

SamplingParams Request::choice_sampling(int choice) const {
  SamplingParams s = sampling;
  if (s.seed) s.seed = *s.seed + static_cast<uint64_t>(choice);
  // What min_tokens keeps from being sampled: the ids that would end the choice.
  s.min_tokens_stop_ids.clear();
  if (s.min_tokens > 0) {
    if (stop.eos_token_id && !stop.ignore_eos) s.min_tokens_stop_ids.push_back(*stop.eos_token_id);
    s.min_tokens_stop_ids.insert(s.min_tokens_stop_ids.end(), stop.stop_token_ids.begin(), stop.stop_token_ids.end());
  }
  // The prompt's logprobs are the same for every choice: only choice 0 asks for them.
  if (choice > 0) s.prompt_logprobs = -1;
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
  if (s.prompt_logprobs < -1 || s.prompt_logprobs > 20)
    return invalid_argument("prompt logprobs must be in [-1, 20], got " + std::to_string(s.prompt_logprobs));
  if (s.min_tokens < 0) return invalid_argument("min_tokens must be >= 0, got " + std::to_string(s.min_tokens));
  for (size_t i = 0; i < s.logit_bias.size(); ++i) {
    const auto& [token, bias] = s.logit_bias[i];
    if (!std::isfinite(bias) || bias < -100.0f || bias > 100.0f)
      return invalid_argument("logit_bias of token " + std::to_string(token) + " must be in [-100, 100], got " +
                              std::to_string(bias));
    if (i > 0 && s.logit_bias[i - 1].first >= token)
      return invalid_argument("logit_bias must list each token once, in id order");
  }
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
  if (l.max_tokens_must_fit && r.pooling == Pooling::kNone && l.max_sequence_len > 0 &&
      prompt_len + r.max_tokens > l.max_sequence_len) {
    return invalid_argument("prompt (" + len + " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
                            ") = " + std::to_string(prompt_len + r.max_tokens) + " exceeds " +
                            sequence_limit_name(l));
  }
  const bool embedding = r.pooling != Pooling::kNone;
  if (embedding && r.n != 1) return invalid_argument("an embedding request has one choice, got n = " + std::to_string(r.n));
  // The prompt plus one generated token; an embedding generates none.
  const int64_t need = prompt_len + (embedding ? 0 : 1);
  if (embedding && l.max_model_len > 0 && need > l.max_model_len)
    return invalid_argument("input of " + len + " tokens exceeds max_model_len " + std::to_string(l.max_model_len));
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
  if (r.sampling.min_tokens > r.max_tokens)
    return invalid_argument("min_tokens (" + std::to_string(r.sampling.min_tokens) + ") must not exceed max_tokens (" +
                            std::to_string(r.max_tokens) + ")");
  for (const auto& [token, bias] : r.sampling.logit_bias) {
    if (token < 0 || (l.vocab_size > 0 && token >= l.vocab_size))
      return invalid_argument("logit_bias token " + std::to_string(token) + " is outside the vocabulary of " +
                              std::to_string(l.vocab_size) + " tokens");
  }
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
