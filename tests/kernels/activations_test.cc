// The activation formulas (kernels/cpu/activations.h, which the CUDA twins copy) against the
// same functions in double precision, over the whole range the models feed them, tails
// included. Written as `1 + erf(z)` / `1 + tanh(u)` the gelus lose nearly every digit below
// x ~ -3 (the sum cancels), and the CPU and CUDA backends then disagree by ~1% there: the
// GPU op test found it (gated_act_packed, gelu_erf, inputs in [-8, 8]).
#include "kernels/cpu/activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace tessera::cpu {
namespace {

double reference(double x, Activation act) {
  switch (act) {
    case Activation::kGeluTanh: {  // 0.5 x (1 + tanh(u)), as x sigmoid(2u): the sum cancels in double too
      const double u = 0.79788456 * x * (1.0 + 0.044715 * x * x);
      return x * (u < 0 ? std::exp(2 * u) / (1.0 + std::exp(2 * u)) : 1.0 / (1.0 + std::exp(-2 * u)));
    }
    case Activation::kGeluErf: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::kSilu: return x / (1.0 + std::exp(-x));
    case Activation::kNone: break;
  }
  return x;
}

TEST(Activations, EveryActivationIsWithinRelative1e4OfDoublePrecisionTailsIncluded) {
  for (Activation act : {Activation::kGeluTanh, Activation::kGeluErf, Activation::kSilu}) {
    int bad = 0;
    double worst = 0;
    // -12 .. 12 in steps of 1/64: the far negative tail down to gelu ~ 1e-30 and beyond.
    for (int i = -768; i <= 768; ++i) {
      const float x = static_cast<float>(i) / 64.0f;
      const double want = reference(x, act);
      const double got = activate(x, act);
      // Relative 1e-4: the f32 rounding of the argument alone moves a far-tail value by up
      // to ~2|u| ulps (gelu_tanh at x = -9: ~1e-5); the cancellation costs 1e-3 and more
      // from x = -4 on, and everything below x ~ -5.9 (1 + erf rounds to 0). Below the
      // smallest normal float, absolute.
      const double tol = 1e-4 * std::fabs(want) + 1e-37;
      const double rel = std::fabs(got - want) / std::max(std::fabs(want), 1e-37);
      worst = std::max(worst, rel);
      if (!(std::fabs(got - want) <= tol) && bad++ < 5) {
        ADD_FAILURE() << activation_name(act) << "(" << x << ") = " << got << ", double says " << want;
      }
    }
    EXPECT_EQ(bad, 0) << activation_name(act) << ": worst relative error " << worst;
  }
}

}  // namespace
}  // namespace tessera::cpu
