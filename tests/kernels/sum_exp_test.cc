// cpu::sum_exp_shifted (the sampler's softmax normaliser) against a double-precision sum of
// std::exp, on vocabulary-sized rows and short ones (vector tails), with -inf entries (masked
// logits) and the spread of values real logits have.
#include "kernels/cpu/sum_exp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace tessera::cpu {
namespace {

TEST(SumExpShifted, MatchesDoubleReferenceToRelative3e7) {
  std::mt19937 rng(5);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 1000, 32000, 151936}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = logit(rng);
    if (n > 3) x[2] = -INFINITY;
    const float mx = *std::max_element(x.begin(), x.end());
    double want = 0;
    for (float v : x) want += std::exp(static_cast<double>(v) - mx);
    const double got = sum_exp_shifted(x.data(), n, mx);
    EXPECT_NEAR(got, want, 3e-7 * want) << "n=" << n;
  }
}

TEST(SumExpShifted, TermsFarBelowTheMaximumAddNothingAndNoNaN) {
  std::vector<float> x = {0.0f, -200.0f, -INFINITY, -1e30f, -88.0f, -87.0f, 0.0f, -1.0f, -3.0f};
  const double got = sum_exp_shifted(x.data(), static_cast<int64_t>(x.size()), 0.0f);
  const double want = 2.0 + std::exp(-1.0) + std::exp(-3.0) + std::exp(-87.0);
  EXPECT_NEAR(got, want, 3e-7 * want);
}

}  // namespace
}  // namespace tessera::cpu
