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
  // The candidates' ids: the mask's, the top-k's, or (none listed) the whole vocabulary.
  std::vector<int32_t> ids = allowed_ids(r);
  const int64_t num_allowed = ids.empty() ? r.vocab : static_cast<int64_t>(ids.size());
  if (p.top_k > 0 && p.top_k < num_allowed) {
    if (ids.empty()) {
      ids.resize(static_cast<size_t>(r.vocab));
      std::iota(ids.begin(), ids.end(), 0);
    }
    // Equal logits in id order, so a seed fully determines the draw.
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + p.top_k, ids.end(), by_logit);
    ids.resize(static_cast<size_t>(p.top_k));
  }
  const bool whole_vocabulary = ids.empty();
  const size_t n = whole_vocabulary ? static_cast<size_t>(r.vocab) : ids.size();
  std::vector<float> gathered;
  if (!whole_vocabulary) {
    gathered.resize(n);
    for (size_t i = 0; i < n; ++i) gathered[i] = logits[ids[i]];
  }
  const float* x = whole_vocabulary ? logits : gathered.data();
  std::vector<float> w(n);
  const double total = cpu::exp_shifted(x, static_cast<int64_t>(n), *std::max_element(x, x + n), p.temperature, w.data());
  std::vector<TokenDistribution::Candidate> candidates(n);
  for (size_t i = 0; i < n; ++i) candidates[i] = {whole_vocabulary ? static_cast<int32_t>(i) : ids[i], w[i]};
  TokenDistribution d(std::move(candidates), total);
  if (p.top_p < 1.0f) d.keep_top_p(p.top_p);
  if (p.min_p > 0.0f) d.keep_min_p(p.min_p);
  return d;
}

namespace {

using Candidate = TokenDistribution::Candidate;

// Draw order: highest weight first, equal weights by lower id. (A function object: the
// algorithms inline it, where a function pointer costs a call per comparison.)
struct InDrawOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
  }
};

// Below this many candidates a selection sorts them and walks them.
constexpr size_t kSortBelow = 32;

double weight_sum(std::span<const Candidate> candidates) {
  double sum = 0;
  for (const Candidate& c : candidates) sum += c.weight;
  return sum;
}

}  // namespace

size_t TokenDistribution::select_by_mass(double mass) {
  const InDrawOrder ahead;
  auto at = [this](size_t i) { return candidates_.begin() + static_cast<std::ptrdiff_t>(i); };
  size_t lo = 0, hi = candidates_.size();
  double before = 0;  // the weight of [0, lo): all of it ahead of [lo, hi)
  // First split: the candidates heavier than 1/256 of the total, at most 256 of them, ahead
  // of the rest. In the peaked distributions of real text most draws land among them, after
  // one pass over the vocabulary that moves only those few.
  if (hi - lo > kSortBelow) {
    const double floor = total_ / 256;
    const auto mid = std::partition(at(lo), at(hi), [&](const Candidate& x) { return x.weight > floor; });
    const auto split = static_cast<size_t>(mid - candidates_.begin());
    const double heavy = weight_sum(std::span<const Candidate>(candidates_.data(), split));
    if (heavy > mass) {
      hi = split;
    } else {
      before = heavy;
      lo = split;
    }
  }
  // Quickselect on the running sum: split [lo, hi) around a pivot (the median of three) into
  // the candidates ahead of it, the pivot, and the rest; go into the side where the sum passes.
  while (hi - lo > kSortBelow) {
    const Candidate& a = candidates_[lo];
    const Candidate& b = candidates_[lo + (hi - lo) / 2];
    const Candidate& c = candidates_[hi - 1];
    const Candidate pivot = ahead(a, b) ? (ahead(b, c) ? b : ahead(a, c) ? c : a) : (ahead(a, c) ? a : ahead(b, c) ? c : b);
    const auto mid = std::partition(at(lo), at(hi), [&](const Candidate& x) { return ahead(x, pivot); });
    const auto split = static_cast<size_t>(mid - candidates_.begin());
    const double ahead_mass = weight_sum(std::span<const Candidate>(&candidates_[lo], split - lo));
    if (before + ahead_mass > mass) {
      hi = split;
      continue;
    }
    std::iter_swap(mid, std::find_if(mid, at(hi), [&](const Candidate& x) { return x.id == pivot.id; }));
    before += ahead_mass;
    if (before + pivot.weight > mass) return split;
    before += pivot.weight;
    lo = split + 1;
  }
  std::sort(at(lo), at(hi), ahead);
  for (size_t k = lo; k < hi; ++k) {
    before += candidates_[k].weight;
    if (before > mass) return k;
  }
  // Rounding left `mass` at or past the total: the last candidate that could be drawn at all.
  size_t last = candidates_.size();
  for (size_t k = 0; k < candidates_.size(); ++k) {
    if (candidates_[k].weight > 0 && (last == candidates_.size() || ahead(candidates_[last], candidates_[k]))) last = k;
  }
  return last == candidates_.size() ? 0 : last;
}

void TokenDistribution::keep_top_p(double fraction) {
  if (candidates_.empty()) return;
  candidates_.resize(select_by_mass(fraction * total_) + 1);
  total_ = weight_sum(candidates_);
}

void TokenDistribution::keep_min_p(double fraction) {
  if (candidates_.empty()) return;
  const Candidate top = *std::min_element(candidates_.begin(), candidates_.end(), InDrawOrder{});
  const double floor = fraction * top.weight;
  const auto kept = std::partition(candidates_.begin(), candidates_.end(),
                                   [&](const Candidate& c) { return c.id == top.id || c.weight >= floor; });
  candidates_.erase(kept, candidates_.end());
  total_ = weight_sum(candidates_);
}

double TokenDistribution::prob(int32_t id) const {
  for (const Candidate& c : candidates_)
    if (c.id == id) return c.weight / total_;
  return 0.0;
}

int32_t TokenDistribution::draw(double u) { return candidates_[select_by_mass(u * total_)].id; }

SampledToken sample_token(const SampleRequest& r) {
  SampledToken out;
  out.token = r.params->temperature <= 0.0f
                  ? greedy_token(r)
                  : token_distribution(r).draw(counter_uniform(r.seed, static_cast<uint64_t>(r.token_index)));
  fill_logprobs(r, out);
  return out;
}

}  // namespace tessera
