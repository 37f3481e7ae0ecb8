#include "worker/sampler.h"
#include "common/splitmix64.h"
#include "kernels/cpu/sum_exp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <unordered_map>

namespace tessera {
namespace {

// Applies the penalties to a copy of the logits (HF repetition penalty over prompt and
// output; OpenAI presence/frequency penalties over the output only).
void apply_penalties(const SampleRequest& r, std::vector<float>& logits) {
  const SamplingParams& p = *r.params;
  if (r.penalty_tokens == nullptr || r.penalty_tokens->empty()) return;
  const size_t count = r.penalty_count < 0 ? r.penalty_tokens->size()
                                           : std::min(r.penalty_tokens->size(), static_cast<size_t>(r.penalty_count));
  const std::span<const int32_t> tokens(r.penalty_tokens->data(), count);
  if (p.repetition_penalty != 1.0f) {
    std::vector<bool> seen(r.vocab, false);
    for (int32_t t : tokens) {
      if (t >= 0 && t < r.vocab && !seen[t]) {
        seen[t] = true;
        logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
      }
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (size_t i = static_cast<size_t>(r.penalty_prompt_len); i < tokens.size(); ++i) ++counts[tokens[i]];
    for (const auto& [t, n] : counts) {
      if (t >= 0 && t < r.vocab) logits[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(n);
    }
  }
}

// logit_bias, then (before min_tokens tokens were generated) -inf on the ids that would end
// the choice. Both act on what is sampled, not on the reported logprobs.
void apply_bias_and_min_tokens(const SampleRequest& r, std::vector<float>& logits) {
  const SamplingParams& p = *r.params;
  for (const auto& [t, bias] : p.logit_bias) {
    if (t >= 0 && t < r.vocab) logits[t] += bias;
  }
  if (r.token_index < p.min_tokens) {
    for (int32_t t : p.min_tokens_stop_ids) {
      if (t >= 0 && t < r.vocab) logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace

void fill_logprobs(const SampleRequest& r, SampledToken& out) {
  out.logprob = raw_logprobs(r.logits, r.vocab, out.token, r.params->logprobs, &out.top_logprobs);
}

float raw_logprobs(const float* l, int64_t vocab, int32_t token, int top_k, std::vector<TokenLogprob>* top) {
  const float mx = *std::max_element(l, l + vocab);
  const double log_z = mx + std::log(cpu::sum_exp_shifted(l, vocab, mx));
  const int k = static_cast<int>(std::min<int64_t>(top_k, vocab));
  if (k > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int i = 0; i < k; ++i) top->push_back({ids[i], static_cast<float>(l[ids[i]] - log_z)});
  }
  return static_cast<float>(l[token] - log_z);
}

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ splitmix64(counter + 0x632be59bd9b4e019ULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

namespace {

// The ids the mask allows within the vocabulary; empty when there is no mask or it allows none.
std::vector<int32_t> allowed_ids(const SampleRequest& r) {
  std::vector<int32_t> ids;
  const std::span<const uint32_t> mask = r.allowed_tokens;
  if (mask.empty()) return ids;
  for (size_t w = 0; w < mask.size() && static_cast<int64_t>(w) * 32 < r.vocab; ++w) {
    for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const int64_t id = static_cast<int64_t>(w) * 32 + __builtin_ctz(bits);
      if (id < r.vocab) ids.push_back(static_cast<int32_t>(id));
    }
  }
  return ids;
}

}  // namespace

namespace {

// The logits sampling sees: the raw ones, or a copy with logit_bias, the min_tokens mask and
// the penalties applied (in `adjusted`).
const float* adjusted_logits(const SampleRequest& r, std::vector<float>& adjusted) {
  if (!adjusts_logits(*r.params, r.token_index)) return r.logits;
  adjusted.assign(r.logits, r.logits + r.vocab);
  apply_bias_and_min_tokens(r, adjusted);
  apply_penalties(r, adjusted);
  return adjusted.data();
}

}  // namespace

bool adjusts_logits(const SamplingParams& p, int32_t token_index) {
  const bool penalised = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  const bool masked = token_index < p.min_tokens && !p.min_tokens_stop_ids.empty();
  return penalised || masked || !p.logit_bias.empty();
}

int32_t greedy_token(const SampleRequest& r) {
  // Structured output: the candidates are the allowed ids only (in id order, as the full
  // vocabulary would be), so greedy and seeded draws behave as on an unmasked row whose other
  // logits are -inf.
  const std::vector<int32_t> candidates = allowed_ids(r);
  std::vector<float> adjusted;
  const float* logits = adjusted_logits(r, adjusted);
  if (candidates.empty()) return argmax(logits, r.vocab);
  int32_t best = candidates[0];
  for (int32_t id : candidates)
    if (logits[id] > logits[best]) best = id;
  return best;
}

TokenDistribution token_distribution(const SampleRequest& r) {
  const SamplingParams& p = *r.params;
  std::vector<float> adjusted;
  const float* logits = adjusted_logits(r, adjusted);
  TokenDistribution d;
  std::vector<int32_t>& order = d.ids;
  order = allowed_ids(r);
  if (order.empty()) {
    order.resize(static_cast<size_t>(r.vocab));
    std::iota(order.begin(), order.end(), 0);
  }
  const auto num_candidates = static_cast<int64_t>(order.size());
  int64_t keep = num_candidates;
  if (p.top_k > 0 && p.top_k < num_candidates) keep = p.top_k;
  // Highest first; equal logits in id order, so a seed fully determines the draw.
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (keep < num_candidates) {
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
    order.resize(keep);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  std::vector<double>& prob = d.weights;
  prob.resize(static_cast<size_t>(keep));
  const double mx = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += prob[i] = std::exp((logits[order[i]] - mx) / p.temperature);
  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double mass = 0;
    int64_t n = 0;
    while (n < keep && mass < p.top_p * sum) mass += prob[n++];
    keep = std::max<int64_t>(n, 1);
  }
  if (p.min_p > 0.0f) {  // prob[0] is the top token's
    int64_t n = 1;
    while (n < keep && prob[n] >= p.min_p * prob[0]) ++n;
    keep = n;
  }
  order.resize(static_cast<size_t>(keep));
  prob.resize(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) d.total += prob[i];
  return d;
}

double TokenDistribution::prob(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return weights[i] / total;
  return 0.0;
}

int32_t draw_token(const TokenDistribution& d, double u) {
  const double target = u * d.total;
  double acc = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    acc += d.weights[i];
    if (target < acc) return d.ids[i];
  }
  return d.ids.back();
}

SampledToken sample_token(const SampleRequest& r) {
  SampledToken out;
  out.token = r.params->temperature <= 0.0f
                  ? greedy_token(r)
                  : draw_token(token_distribution(r), counter_uniform(r.seed, static_cast<uint64_t>(r.token_index)));
  fill_logprobs(r, out);
  return out;
}

}  // namespace tessera
