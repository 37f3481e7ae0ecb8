// The sampler against first principles: penalties move the right logits, filters keep the
// right tokens, draws follow the distribution, and a seed fixes the stream.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "worker/sampler.h"

namespace tessera {
namespace {

SampledToken draw(const std::vector<float>& logits, const SamplingParams& p, int32_t index = 0,
                  const std::vector<int32_t>* penalty_tokens = nullptr, int32_t prompt_len = 0) {
  SampleRequest r;
  r.logits = logits.data();
  r.vocab = static_cast<int64_t>(logits.size());
  r.params = &p;
  r.seed = p.seed.value_or(0);
  r.token_index = index;
  r.penalty_tokens = penalty_tokens;
  r.penalty_prompt_len = prompt_len;
  return sample_token(r);
}

TEST(Sampler, GreedyTakesTheLowestIdAmongTies) {
  SamplingParams p;
  EXPECT_EQ(draw({0.f, 3.f, 1.f, 3.f}, p).token, 1);
}

TEST(Sampler, LogprobsAreALogSoftmaxOfTheRawLogits) {
  SamplingParams p;
  p.logprobs = 3;
  std::vector<float> l = {1.f, 2.f, 0.5f, -1.f};
  SampledToken t = draw(l, p);
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].token, 1);
  EXPECT_EQ(t.top_logprobs[1].token, 0);
  EXPECT_EQ(t.top_logprobs[2].token, 2);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  // Token 0 leads (3.0) but was seen: 3/2 = 1.5 < 2.0, so token 1 wins.
  std::vector<int32_t> seen = {0};
  EXPECT_EQ(draw({3.f, 2.f, -1.f}, p, 0, &seen, 1).token, 1);
  // A negative seen logit gets more negative: token 2 (-0.5 * 2 = -1) loses to token 1 (-0.9).
  std::vector<int32_t> seen2 = {2};
  EXPECT_EQ(draw({-5.f, -0.9f, -0.5f}, p, 0, &seen2, 1).token, 1);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOnlyTheOutput) {
  SamplingParams p;
  p.frequency_penalty = 1.0f;
  // Prompt holds token 0 three times (ignored); output holds token 1 twice: 5 - 2 = 3 < 4.
  std::vector<int32_t> tokens = {0, 0, 0, 1, 1};
  EXPECT_EQ(draw({4.5f, 5.f, 4.f}, p, 0, &tokens, 3).token, 0);
  SamplingParams q;
  q.presence_penalty = 0.6f;  // once, whatever the count: 5 - 0.6 = 4.4 < 4.5
  EXPECT_EQ(draw({4.5f, 5.f, 4.f}, q, 0, &tokens, 3).token, 0);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> l = {0.1f, 0.3f, 2.0f, 1.9f};
  for (int i = 0; i < 50; ++i) {
    SamplingParams k;
    k.temperature = 1.0f;
    k.top_k = 1;
    k.seed = i;
    EXPECT_EQ(draw(l, k, i).token, 2);
    SamplingParams tp;
    tp.temperature = 1.0f;
    tp.top_p = 0.01f;
    tp.seed = i;
    EXPECT_EQ(draw(l, tp, i).token, 2);
  }
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // p ∝ e^{logit}: token 0 has e^-5 of the top token's mass, under min_p = 0.01.
  std::vector<float> l = {-5.f, 0.f, -0.1f};
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.min_p = 0.01f;
    p.seed = 7;
    counts[draw(l, p, i).token]++;
  }
  EXPECT_EQ(counts[0], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
}

TEST(Sampler, DrawsFollowTheSoftmaxAtTheGivenTemperature) {
  std::vector<float> l = {0.f, 1.f, 2.f};
  const float temperature = 0.5f;
  const int n = 20000;
  std::vector<int> counts(3, 0);
  for (int i = 0; i < n; ++i) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 99;
    counts[draw(l, p, i).token]++;
  }
  double z = 0;
  for (float v : l) z += std::exp(v / temperature);
  for (int t = 0; t < 3; ++t) {
    const double expected = std::exp(l[t] / temperature) / z;
    // 5 standard deviations of a binomial proportion.
    const double tol = 5 * std::sqrt(expected * (1 - expected) / n) + 1e-3;
    EXPECT_NEAR(static_cast<double>(counts[t]) / n, expected, tol) << "token " << t;
  }
}

TEST(Sampler, TheDrawIsAFunctionOfSeedAndIndexOnly) {
  EXPECT_EQ(counter_uniform(5, 17), counter_uniform(5, 17));
  EXPECT_NE(counter_uniform(5, 17), counter_uniform(5, 18));
  EXPECT_NE(counter_uniform(5, 17), counter_uniform(6, 17));
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = counter_uniform(3, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(Sampler, LogitBiasMovesTheDrawButNotTheReportedLogprob) {
  SamplingParams p;
  const std::vector<float> l = {0.f, 3.f, 1.f, 2.f};
  p.logit_bias = {{1, -100.0f}};
  SampledToken t = draw(l, p);
  EXPECT_EQ(t.token, 3);  // greedy without token 1
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);  // raw model output
  p.logit_bias = {{0, 100.0f}};
  p.temperature = 1.0f;
  p.seed = 5;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(draw(l, p, i).token, 0);  // +100 dominates every draw
}

TEST(Sampler, MinTokensMasksStopIdsOnlyBeforeTheCount) {
  SamplingParams p;
  const std::vector<float> l = {0.f, 5.f, 1.f, 2.f};  // id 1 plays eos
  p.min_tokens = 3;
  p.min_tokens_stop_ids = {1};
  EXPECT_EQ(draw(l, p, 0).token, 3);
  EXPECT_EQ(draw(l, p, 2).token, 3);
  EXPECT_EQ(draw(l, p, 3).token, 1);  // three tokens generated: eos may come
  p.temperature = 1.0f;
  p.seed = 9;
  for (int i = 0; i < 3; ++i) EXPECT_NE(draw(l, p, i).token, 1);
}

TEST(Sampler, RawLogprobsGivesTopAlternativesBestFirst) {
  const std::vector<float> l = {1.f, 4.f, 4.f, -2.f};
  std::vector<TokenLogprob> top;
  const float lp = raw_logprobs(l.data(), 4, 0, 2, &top);
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(lp, 1.0 - std::log(z), 1e-5);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].token, 1);  // ties to the lower id
  EXPECT_EQ(top[1].token, 2);
  EXPECT_NEAR(top[0].logprob, 4.0 - std::log(z), 1e-5);
}

}  // namespace
}  // namespace tessera
