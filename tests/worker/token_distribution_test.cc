// TokenDistribution's cuts and draws, which select by running mass instead of sorting,
// against the definition written the slow way: the candidates sorted into draw order
// (highest weight first, equal weights by lower id) and walked. Random weights over sizes
// below, around and far above the selection's small-range and first-split thresholds,
// peaked and flat, with runs of equal weights and zero weights; and through token_distribution
// on a vocabulary whose logits are all equal, where draw order is id order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "worker/sampler.h"

namespace tessera {
namespace {

using Candidate = TokenDistribution::Candidate;

std::vector<Candidate> in_draw_order(std::vector<Candidate> c) {
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
  });
  return c;
}

double sum_of(const std::vector<Candidate>& c) {
  double s = 0;
  for (const Candidate& x : c) s += x.weight;
  return s;
}

// Candidates with ids shuffled and weights exp(spread * normal): spread 4 is peaked, 0.5
// flat. Every fifth weight repeats its neighbour's (ties) and a few are zero (masked).
std::vector<Candidate> random_candidates(size_t n, double spread, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Candidate> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = {static_cast<int32_t>(i), std::exp(spread * normal(rng))};
  for (size_t i = 5; i < n; i += 5) c[i].weight = c[i - 1].weight;
  for (size_t i = 7; i < n; i += 97) c[i].weight = 0;
  std::shuffle(c.begin(), c.end(), rng);
  return c;
}

// The id the walk in draw order reaches when the running sum first exceeds `mass`.
int32_t reference_draw(const std::vector<Candidate>& sorted, double mass) {
  double acc = 0;
  for (const Candidate& c : sorted) {
    acc += c.weight;
    if (acc > mass) return c.id;
  }
  return -1;
}

constexpr size_t kSizes[] = {1, 2, 31, 32, 33, 100, 257, 1000, 32000};

TEST(TokenDistribution, DrawsLandWhereTheRunningSumInDrawOrderPassesTheTarget) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (size_t n : kSizes) {
    for (double spread : {4.0, 0.5}) {
      const std::vector<Candidate> c = random_candidates(n, spread, rng);
      const std::vector<Candidate> sorted = in_draw_order(c);
      const double total = sum_of(c);
      for (int k = 0; k < 40; ++k) {
        const double u = k == 0 ? 0.0 : uniform(rng);
        TokenDistribution d(c, total);
        ASSERT_EQ(d.draw(u), reference_draw(sorted, u * total)) << "n=" << n << " spread=" << spread << " u=" << u;
      }
    }
  }
}

TEST(TokenDistribution, TopPKeepsTheShortestPrefixInDrawOrderPassingTheMass) {
  std::mt19937 rng(4);
  for (size_t n : kSizes) {
    for (double spread : {4.0, 0.5}) {
      const std::vector<Candidate> c = random_candidates(n, spread, rng);
      const std::vector<Candidate> sorted = in_draw_order(c);
      for (double top_p : {0.05, 0.5, 0.9, 0.999}) {
        TokenDistribution d(c, sum_of(c));
        d.keep_top_p(top_p);
        size_t want = 0;
        double acc = 0;
        while (want < sorted.size() && !(acc > top_p * sum_of(c))) acc += sorted[want++].weight;
        ASSERT_EQ(d.size(), want) << "n=" << n << " spread=" << spread << " top_p=" << top_p;
        const std::vector<Candidate> kept = in_draw_order({d.candidates().begin(), d.candidates().end()});
        for (size_t i = 0; i < want; ++i) ASSERT_EQ(kept[i].id, sorted[i].id) << i;
        EXPECT_NEAR(d.total(), sum_of(kept), 1e-12 * d.total());
      }
    }
  }
}

TEST(TokenDistribution, MinPKeepsWhatWeighsAtLeastTheFractionOfTheHeaviest) {
  std::mt19937 rng(5);
  for (size_t n : kSizes) {
    const std::vector<Candidate> c = random_candidates(n, 2.0, rng);
    const std::vector<Candidate> sorted = in_draw_order(c);
    for (double min_p : {0.0, 0.01, 0.3, 1.0}) {
      TokenDistribution d(c, sum_of(c));
      d.keep_min_p(min_p);
      size_t want = 1;
      while (want < sorted.size() && sorted[want].weight >= min_p * sorted[0].weight) ++want;
      const std::vector<Candidate> kept = in_draw_order({d.candidates().begin(), d.candidates().end()});
      ASSERT_EQ(kept.size(), want) << "n=" << n << " min_p=" << min_p;
      for (size_t i = 0; i < want; ++i) ASSERT_EQ(kept[i].id, sorted[i].id) << i;
    }
  }
}

TEST(TokenDistribution, EqualLogitsDrawInIdOrderAcrossAWholeVocabulary) {
  const int64_t vocab = 50000;
  std::vector<float> logits(static_cast<size_t>(vocab), 0.25f);
  SamplingParams params;
  params.temperature = 0.7f;
  SampleRequest r;
  r.logits = logits.data();
  r.vocab = vocab;
  r.params = &params;
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{256}, int64_t{31337}, vocab - 1}) {
    TokenDistribution d = token_distribution(r);
    ASSERT_EQ(d.size(), static_cast<size_t>(vocab));
    // The middle of id k's share of [0, 1).
    EXPECT_EQ(d.draw((static_cast<double>(k) + 0.5) / static_cast<double>(vocab)), k);
  }
}

TEST(TokenDistribution, AMassPastTheTotalGivesTheLastCandidateThatCanBeDrawn) {
  std::vector<Candidate> c = {{4, 0.0}, {9, 0.5}, {2, 2.0}, {6, 0.5}, {1, 0.0}};
  TokenDistribution d(c, 3.0);
  EXPECT_EQ(d.draw(1.0), 9);  // 6 and 9 weigh the same; 9 is the later in draw order
}

}  // namespace
}  // namespace tessera
