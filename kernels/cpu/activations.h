#pragma once
// Scalar activation functions, written exactly as the reference implementations compute
// them so that fused and plain paths (and every backend's CPU reference) agree.
#include <cmath>

#include "kernels/activation.h"

namespace tessera::cpu {

// BLOOM's bloom_gelu_forward: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x^2))).
inline float gelu_tanh(float x) {
  return x * 0.5f * (1.0f + std::tanh(0.79788456f * x * (1.0f + 0.044715f * x * x)));
}

// SiLU as torch computes it: x * sigmoid(x).
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch's exact gelu: 0.5 * x * (1 + erf(x / sqrt(2))).
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

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
