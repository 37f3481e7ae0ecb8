#include "kernels/activation.h"

namespace tessera {

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kNone: return "none";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kGeluErf: return "gelu_erf";
    case Activation::kSilu: return "silu";
  }
  return "?";
}

bool activation_from_name(const std::string& n, Activation* out) {
  // transformers' ACT2FN: "gelu" is the exact erf form; the tanh forms differ from each
  // other only in how the same polynomial is written.
  if (n == "gelu") {
    *out = Activation::kGeluErf;
  } else if (n == "gelu_new" || n == "gelu_pytorch_tanh" || n == "gelu_fast" || n == "bloom_gelu") {
    *out = Activation::kGeluTanh;
  } else if (n == "silu" || n == "swish") {
    *out = Activation::kSilu;
  } else {
    return false;
  }
  return true;
}

}  // namespace tessera
