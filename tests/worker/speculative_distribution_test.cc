// Speculative sampling leaves the output distribution alone: at temperature 1 (and with
// top-p 0.9), 4,000 seeded samples of kjv-llama's first three generated tokens with a draft
// model proposing (the trained draft fixture, and a deliberately bad random-weight draft)
// against 4,000 without speculation, position by position, by a chi-square test of
// homogeneity (p >= 0.01 asked; every p is reported). The same test must see the difference
// between kjv-llama and its draft sampled on their own, or it could not fail.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "coordinator/engine/engine.h"
#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

constexpr int kSamples = 4000;
constexpr int kPositions = 3;
using Counts = std::array<std::map<int32_t, int>, kPositions>;

// Regularised upper incomplete gamma Q(a, x): the chi-square survival function is Q(df/2, x/2).
double upper_gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_front = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {  // series for P, then Q = 1 - P
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && std::fabs(term) > 1e-15 * std::fabs(sum); ++n) sum += term *= x / (a + n);
    return 1.0 - sum * std::exp(log_front);
  }
  // Continued fraction (modified Lentz) for Q.
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < 1e-15) break;
  }
  return std::exp(log_front) * h;
}

// Chi-square test of homogeneity of two samples' token counts; tokens expected fewer than 5
// times in either sample are pooled into one category. Returns the p-value.
double homogeneity_p(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::set<int32_t> tokens;
  for (const auto& [t, n] : a) tokens.insert(t);
  for (const auto& [t, n] : b) tokens.insert(t);
  double na = 0, nb = 0;
  for (const auto& [t, n] : a) na += n;
  for (const auto& [t, n] : b) nb += n;
  std::vector<std::pair<double, double>> cells;
  std::pair<double, double> pooled{0, 0};
  for (int32_t t : tokens) {
    const double ca = a.count(t) ? a.at(t) : 0, cb = b.count(t) ? b.at(t) : 0;
    const double expected_min = (ca + cb) * std::min(na, nb) / (na + nb);
    if (expected_min < 5) {
      pooled.first += ca;
      pooled.second += cb;
    } else {
      cells.push_back({ca, cb});
    }
  }
  if (pooled.first + pooled.second > 0) cells.push_back(pooled);
  if (cells.size() < 2) return 1.0;
  double chi2 = 0;
  for (const auto& [ca, cb] : cells) {
    const double total = ca + cb;
    const double ea = total * na / (na + nb), eb = total * nb / (na + nb);
    chi2 += (ca - ea) * (ca - ea) / ea + (cb - eb) * (cb - eb) / eb;
  }
  return upper_gamma_q((static_cast<double>(cells.size()) - 1) / 2, chi2 / 2);
}

class SpeculativeDistributionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    if (testing::kSanitizedBuild) GTEST_SKIP() << "32,000 sampled sequences: the plain build runs this";
    auto b = make_backend("cpu");
    ASSERT_TRUE(b.is_ok());
    backend_ = std::move(b).value();
    target_ = load(testing::fixtures_dir() + "/kjv-llama");
    draft_ = load(testing::fixtures_dir() + "/kjv-llama-draft");
    // The bad draft: random weights of kjv-llama's vocabulary and context.
    const std::string dir = testing::make_temp_dir("tessera-bad-draft");
    const auto made = testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --vocab 1024 " +
                                           "--max-positions 512 --seed 99 --out '" + dir + "'");
    ASSERT_EQ(made.exit_code, 0) << made.err;
    bad_draft_ = load(dir);
    std::filesystem::remove_all(dir);
  }

  std::unique_ptr<Transformer> load(const std::string& path) {
    auto m = Transformer::load(path, ModelLoadOptions{}, *backend_);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m).value() : nullptr;
  }

  // The first three tokens of kSamples seeded requests (seeds seed0 ...) of one verse prompt.
  Counts sample(Transformer& model, Transformer* draft, SamplingParams sampling, uint64_t seed0) {
    constexpr int kGroup = 500;
    SchedulerConfig sc;
    sc.block_size = 16;
    sc.num_blocks = kGroup * 3 + 8;
    sc.max_num_seqs = kGroup;
    sc.max_num_batched_tokens = 8192;
    sc.max_model_len = 512;
    if (draft != nullptr) {
      sc.speculative.method = SpeculativeConfig::Method::kDraft;
      sc.speculative.num_tokens = 3;
      sc.speculative.draft_model = "(in process)";
    }
    Executor executor(model, *backend_, sc.block_size, sc.num_blocks, model.dtype(), draft);
    Engine engine(sc, executor);
    const std::vector<int32_t> prompt = {1, 299, 958, 261, 807, 267, 958, 293};  // a verse's opening
    std::map<SeqId, std::vector<int32_t>> out;
    Counts counts;
    for (int first = 0; first < kSamples; first += kGroup) {
      for (int i = first; i < first + kGroup; ++i) {
        sampling.seed = seed0 + static_cast<uint64_t>(i);
        StopConditions stop;
        stop.ignore_eos = true;
        // One token past the counted ones: the draft then proposes every counted token after
        // the first (the last generated one is the bonus or correction token).
        EXPECT_TRUE(engine.add_request(static_cast<RequestId>(i + 1), make_request(prompt, kPositions + 1, sampling, stop)).is_ok());
      }
      while (engine.has_work())
        for (const SequenceEvent& ev : engine.step()) {
          EXPECT_NE(ev.reason, FinishReason::kError) << ev.error;
          for (const SampledToken& t : ev.new_tokens) out[ev.seq_id].push_back(t.token);
        }
    }
    EXPECT_EQ(out.size(), static_cast<size_t>(kSamples));
    for (const auto& [id, tokens] : out)
      for (int p = 0; p < kPositions && p < static_cast<int>(tokens.size()); ++p) ++counts[p][tokens[p]];
    if (draft != nullptr) {
      const SpecDecodeStats& spec = engine.scheduler().stats().spec;
      EXPECT_GT(spec.num_draft_tokens, 0u) << "no proposals were checked";
      std::cout << "[ REPORT   ] " << spec.num_accepted_tokens << " of " << spec.num_draft_tokens
                << " proposals accepted" << std::endl;
    }
    return counts;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> target_, draft_, bad_draft_;
};

TEST_F(SpeculativeDistributionTest, DraftProposalsLeaveTheFirstThreeTokensDistributedAsWithout) {
  ASSERT_TRUE(target_ && draft_ && bad_draft_);
  SamplingParams t1;
  t1.temperature = 1.0f;
  SamplingParams top_p = t1;
  top_p.top_p = 0.9f;
  for (const auto& [name, sampling] : {std::pair{"temperature 1", t1}, std::pair{"top-p 0.9", top_p}}) {
    const Counts plain = sample(*target_, nullptr, sampling, 1);
    for (const auto& [draft_name, draft] : {std::pair{"draft fixture", draft_.get()}, std::pair{"bad draft", bad_draft_.get()}}) {
      const Counts spec = sample(*target_, draft, sampling, 1000003);
      for (int p = 0; p < kPositions; ++p) {
        const double pv = homogeneity_p(plain[p], spec[p]);
        std::cout << "[ REPORT   ] " << name << ", " << draft_name << ": token " << p + 1 << " chi-square p = " << pv
                  << std::endl;
        EXPECT_GE(pv, 0.01) << name << ", " << draft_name << ", token " << p + 1;
      }
    }
  }
}

// The test's power: kjv-llama against its draft sampled on their own (the draft's own
// distribution, which the rule corrects) differ at p far below 0.01.
TEST_F(SpeculativeDistributionTest, TheTestSeesTheDraftsOwnDistribution) {
  ASSERT_TRUE(target_ && draft_);
  SamplingParams t1;
  t1.temperature = 1.0f;
  const Counts target = sample(*target_, nullptr, t1, 1);
  const Counts draft_alone = sample(*draft_, nullptr, t1, 1000003);
  const double pv = homogeneity_p(target[1], draft_alone[1]);
  std::cout << "[ REPORT   ] kjv-llama against its draft alone, token 2: chi-square p = " << pv << std::endl;
  EXPECT_LT(pv, 1e-6);
}

}  // namespace
}  // namespace tessera
