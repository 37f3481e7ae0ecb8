#pragma once
// Turns one row of logits into a token: the structured-output mask (only allowed ids
// compete), logit_bias and the min_tokens mask, penalties
// (repetition, presence, frequency), then
// greedy (temperature 0; ties to the lowest id, as torch.argmax) or sampling with
// temperature, top-k, top-p and min-p. The random draw is counter-based: a pure function of
// (seed, index of the token being generated), so a seeded request yields the same tokens
// whatever else shares its batch and whether or not it was preempted.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/sampling_params.h"
#include "common/step_plan.h"

namespace tessera {

struct SampleRequest {
  const float* logits = nullptr;  // [vocab], raw model output
  int64_t vocab = 0;
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;         // resolved seed (the request's, or one the coordinator chose)
  int32_t token_index = 0;   // counter of the generator: how many tokens were generated before
  const std::vector<int32_t>* penalty_tokens = nullptr;  // prompt + output, when a penalty is set
  int32_t penalty_prompt_len = 0;
  // Only the first penalty_count of penalty_tokens count (-1: all): a row verifying a
  // speculative proposal sees the tokens before it, not the proposals after it.
  int32_t penalty_count = -1;
  // Structured output: when not empty, only these ids may be chosen (a bitset, bit
  // t % 32 of word t / 32, common/step_plan.h SeqStep::allowed_tokens). A mask that allows no
  // id of the vocabulary is not applied (the coordinator then refuses the token it gets).
  std::span<const uint32_t> allowed_tokens;
};

int32_t argmax(const float* logits, int64_t vocab);
// Whether sampling the token at `token_index` reads other logits than the raw ones: a
// penalty, logit_bias, or the min_tokens mask while it applies (the grammar mask aside).
bool adjusts_logits(const SamplingParams& params, int32_t token_index);
// log-softmax of the raw `logits` at `token`; with top_k > 0 the top_k best ids (ties to the
// lower id) and their logprobs are appended to *top. Sampled tokens and prompt tokens alike.
float raw_logprobs(const float* logits, int64_t vocab, int32_t token, int top_k, std::vector<TokenLogprob>* top);
// A uniform double in [0, 1) from (seed, counter) alone.
double counter_uniform(uint64_t seed, uint64_t counter);
// Chooses the token and fills its logprob (log-softmax of the raw logits) and, when asked,
// the top `params->logprobs` alternatives.
SampledToken sample_token(const SampleRequest& request);

// What a temperature > 0 request draws from: the candidates top-k, top-p and min-p keep
// (after the mask, logit_bias, min_tokens and penalties), with unnormalised weights
// exp((logit - max) / temperature). Cuts and draws follow draw order (highest weight first,
// equal weights by lower id) without sorting the candidates: a weighted selection finds
// where the running sum of weights in that order passes a mass in linear expected time,
// so plain temperature sampling (the OpenAI API's default) over a 128k vocabulary costs a
// few passes over it, not a sort of it for every token.
class TokenDistribution {
 public:
  struct Candidate {
    int32_t id;
    double weight;
  };
  TokenDistribution() = default;
  // `total`: the weights' sum.
  TokenDistribution(std::vector<Candidate> candidates, double total)
      : candidates_(std::move(candidates)), total_(total) {}

  size_t size() const { return candidates_.size(); }
  double total() const { return total_; }  // the weights' sum
  std::span<const Candidate> candidates() const { return candidates_; }  // in no set order
  // The probability of `id` (0 when it is not a candidate); a scan of the candidates.
  double prob(int32_t id) const;
  // top-p: keeps the fewest candidates, first in draw order, whose weight passes `fraction`
  // of the total (at least one).
  void keep_top_p(double fraction);
  // min-p: keeps the candidates whose weight is at least `fraction` of the heaviest one's.
  void keep_min_p(double fraction);
  // The candidate a uniform draw u in [0, 1) lands on: where the running sum of weights in
  // draw order first passes u * total.
  int32_t draw(double u);

 private:
  // Reorders the candidates so that the ones before the returned index are exactly those
  // ahead of it in draw order, and returns the index of the candidate at which the running
  // sum of weights in draw order first exceeds `mass` (the last candidate of positive weight
  // when rounding leaves `mass` at or past the total).
  size_t select_by_mass(double mass);

  std::vector<Candidate> candidates_;
  double total_ = 0;
};
TokenDistribution token_distribution(const SampleRequest& request);
// The token a temperature-0 request takes: the highest adjusted logit (ties to the lowest id).
int32_t greedy_token(const SampleRequest& request);
// Fills token.logprob and the top alternatives from the raw logits of `request`.
void fill_logprobs(const SampleRequest& request, SampledToken& token);

}  // namespace tessera
