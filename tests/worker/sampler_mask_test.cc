// The sampler's structured-output mask (SampleRequest::allowed_tokens): only allowed ids are
// ever chosen, greedy takes the best allowed one, seeded draws are exactly those of the same
// row with every other logit at -inf (so a constrained request draws as the distribution
// renormalised over the allowed ids), and an empty mask or one allowing no id changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "worker/sampler.h"

namespace tessera {
namespace {

SampledToken masked_draw(const std::vector<float>& logits, const SamplingParams& p, int32_t index,
                         const std::vector<uint32_t>* mask) {
  SampleRequest r;
  r.logits = logits.data();
  r.vocab = static_cast<int64_t>(logits.size());
  r.params = &p;
  r.seed = p.seed.value_or(0);
  r.token_index = index;
  if (mask != nullptr) r.allowed_tokens = *mask;
  return sample_token(r);
}

std::vector<uint32_t> mask_of(std::initializer_list<int> ids, size_t vocab) {
  std::vector<uint32_t> m((vocab + 31) / 32, 0);
  for (int id : ids) m[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  return m;
}

TEST(SamplerMask, GreedyTakesTheBestAllowedToken) {
  SamplingParams p;
  p.logprobs = 1;
  const std::vector<float> l = {5.f, 1.f, 3.f, 4.f};
  const std::vector<uint32_t> m = mask_of({1, 2}, l.size());
  const SampledToken t = masked_draw(l, p, 0, &m);
  EXPECT_EQ(t.token, 2);
  // The reported logprob is still the raw model's (log-softmax over the whole row).
  double z = 0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(t.logprob, 3.0 - std::log(z), 1e-5);
  ASSERT_EQ(t.top_logprobs.size(), 1u);
  EXPECT_EQ(t.top_logprobs[0].token, 0) << "top alternatives are the raw row's";
}

TEST(SamplerMask, SeededDrawsEqualTheRowWithDisallowedLogitsAtMinusInfinity) {
  std::vector<float> l(70);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 7) % 11) * 0.3f;
  const std::vector<uint32_t> m = mask_of({1, 4, 33, 40, 41, 69}, l.size());
  std::vector<float> inf = l;
  for (size_t i = 0; i < l.size(); ++i)
    if (!((m[i / 32] >> (i % 32)) & 1u)) inf[i] = -std::numeric_limits<float>::infinity();
  for (float temperature : {0.5f, 1.0f, 1.7f}) {
    for (int top_k : {0, 3}) {
      SamplingParams p;
      p.temperature = temperature;
      p.top_k = top_k;
      p.top_p = 0.95f;
      p.seed = 1234;
      for (int i = 0; i < 300; ++i) {
        const int32_t got = masked_draw(l, p, i, &m).token;
        ASSERT_TRUE((m[static_cast<size_t>(got) / 32] >> (got % 32)) & 1u) << "token " << got << " is not allowed";
        ASSERT_EQ(got, masked_draw(inf, p, i, nullptr).token) << "temperature " << temperature << " index " << i;
      }
    }
  }
}

TEST(SamplerMask, AnEmptyMaskOrOneAllowingNoIdChangesNothing) {
  const std::vector<float> l = {0.2f, 1.5f, -0.3f, 0.9f, 0.1f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  const std::vector<uint32_t> empty;
  const std::vector<uint32_t> none = mask_of({}, l.size());
  const std::vector<uint32_t> beyond = {0u, 1u};  // id 32: outside this vocabulary
  for (int i = 0; i < 100; ++i) {
    const int32_t plain = masked_draw(l, p, i, nullptr).token;
    EXPECT_EQ(masked_draw(l, p, i, &empty).token, plain);
    EXPECT_EQ(masked_draw(l, p, i, &none).token, plain);
    EXPECT_EQ(masked_draw(l, p, i, &beyond).token, plain);
  }
}

}  // namespace
}  // namespace tessera
