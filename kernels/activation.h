#pragma once
// The activation functions of the MLPs Tessera serves, named as the checkpoints' configs
// name them (see activation_from_name). One enum for every backend and for the fused
// linear epilogue, so a new activation is one case in each kernel, not a new op.
#include <cstdint>
#include <string>

namespace tessera {

enum class Activation : uint8_t {
  kNone,
  kGeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu_new, gelu_pytorch_tanh, BLOOM
  kGeluErf,   // 0.5 x (1 + erf(x / sqrt(2))): torch's exact gelu (Falcon, GPT-NeoX "gelu")
  kSilu,      // x * sigmoid(x)
};

const char* activation_name(Activation act);  // "none", "gelu_tanh", "gelu_erf", "silu"

// Maps a Hugging Face activation name ("gelu", "gelu_new", "gelu_pytorch_tanh", "silu",
// ...) to the function; false when Tessera does not implement it.
bool activation_from_name(const std::string& hf_name, Activation* out);

}  // namespace tessera
