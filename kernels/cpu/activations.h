#pragma once
// Scalar activation functions, written exactly as the reference implementations compute
// them so that fused and plain paths (and every backend's CPU reference) agree.
#include <cmath>

#include "kernels/activation.h"

namespace tessera::cpu {

// The two gelus below are written without `1 + tanh` or `1 + erf`: for x below about -3
// those sums cancel (tanh and erf are within a few ulps of -1), leaving a result that is
// right only to ~ulp(1) * |x| in absolute terms -- a 1% error on gelu(-4.5) ~ -1.5e-5 --
// and two correct implementations (this one and the CUDA twin) then disagree by that much.
// The identities used are exact, so the values are the same functions, rounded once.

// BLOOM's bloom_gelu_forward: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x^2))),
// as x * sigmoid(2u) (0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u))).
inline float gelu_tanh(float x) {
  const float u = 0.79788456f * x * (1.0f + 0.044715f * x * x);
  return x / (1.0f + std::exp(-2.0f * u));
}

// SiLU as torch computes it: x * sigmoid(x).
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch's exact gelu: 0.5 * x * (1 + erf(x / sqrt(2))), as 0.5 * x * erfc(-x / sqrt(2)).
inline float gelu_erf(float x) { return 0.5f * x * std::erfc(x * -0.70710678118654752f); }

inline float activate(float x, Activation act) {
  switch (act) {
    case Activation::kGeluTanh: return gelu_tanh(x);
    case Activation::kGeluErf: return gelu_erf(x);
    case Activation::kSilu: return silu(x);
    case Activation::kNone: break;
  }
  return x;
}

}  // namespace tessera::cpu
