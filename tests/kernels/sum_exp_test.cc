// cpu::sum_exp_shifted (the sampler's softmax normaliser) and cpu::exp_shifted (its
// candidates' weights) against double-precision std::exp, on vocabulary-sized rows and short
// ones (vector tails), with -inf entries (masked logits) and the spread of values real logits
// have.
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

TEST(ExpShifted, EachWeightAndTheSumMatchDoubleReferenceAtEveryTemperature) {
  std::mt19937 rng(6);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (float temperature : {1.0f, 0.3f, 2.5f, 1e-4f}) {
    for (int64_t n : {1, 7, 8, 9, 17, 32000}) {
      std::vector<float> x(static_cast<size_t>(n)), out(static_cast<size_t>(n), -1.0f);
      for (float& v : x) v = logit(rng);
      if (n > 3) x[2] = -INFINITY;
      const float mx = *std::max_element(x.begin(), x.end());
      double want_sum = 0;
      const double got_sum = exp_shifted(x.data(), n, mx, temperature, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const double arg = (static_cast<double>(x[i]) - mx) / temperature;
        const double want = std::exp(arg);
        want_sum += want;
        // The float exp's 2e-7, and the float rounding of its argument (a relative 2^-24 of
        // it, so as much again of the result per unit of |arg|).
        const double tolerance = std::isinf(arg) ? 0.0 : want * (3e-7 + 1.2e-7 * std::fabs(arg)) + 1e-37;
        ASSERT_NEAR(out[i], want, tolerance) << "n=" << n << " t=" << temperature << " i=" << i;
      }
      EXPECT_NEAR(got_sum, want_sum, 3e-7 * want_sum) << "n=" << n << " t=" << temperature;
      EXPECT_EQ(out[std::max_element(x.begin(), x.end()) - x.begin()], 1.0f);  // the maximum weighs 1
    }
  }
}

}  // namespace
}  // namespace tessera::cpu

// CpuBackend::greedy_rows: per row the highest logit (the lowest id of equal ones) and its
// log-softmax, against a long-double reference; -inf entries (masked) count for nothing.
#include "kernels/cpu/cpu_backend.h"

namespace tessera::cpu {
namespace {

TEST(GreedyRows, HighestLogitLowestIdAndItsLogSoftmax) {
  CpuBackend backend(1, CpuKernelOptions{});
  std::mt19937 rng(11);
  std::normal_distribution<float> logit(0.0f, 5.0f);
  for (int64_t vocab : {int64_t{1}, int64_t{9}, int64_t{32000}}) {
    const int64_t rows = 4;
    Tensor logits = Tensor::zeros({rows, vocab}, DType::kF32);
    float* l = logits.data<float>();
    for (int64_t i = 0; i < rows * vocab; ++i) l[i] = logit(rng);
    if (vocab > 3) {
      for (int64_t i = 1; i < vocab; i += 2) l[vocab + i] = 40.0f;  // row 1: ties from id 1 on
      l[2 * vocab] = -INFINITY;                                    // row 2: a masked id
    }
    Tensor ids = Tensor::zeros({rows}, DType::kI32), lps = Tensor::zeros({rows}, DType::kF32);
    backend.greedy_rows(logits, ids, lps);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = l + r * vocab;
      const int64_t want = std::max_element(row, row + vocab) - row;  // the first maximum
      long double z = 0;
      for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<long double>(row[i]) - row[want]);
      EXPECT_EQ(ids.data<int32_t>()[r], want) << "vocab " << vocab << " row " << r;
      EXPECT_NEAR(lps.data<float>()[r], static_cast<double>(-std::log(z)), 1e-6) << "vocab " << vocab << " row " << r;
    }
    if (vocab > 3) {
      EXPECT_EQ(ids.data<int32_t>()[1], 1) << "ties go to the lowest id";
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
