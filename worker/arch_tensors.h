#pragma once
// Every tensor a checkpoint of a given model holds, by name and stored shape, derived from
// its ArchSpec row and config: what the loader reads (and checks), spelled out once so
// that tessera-make-checkpoint can write a checkpoint of any family in the table without
// a branch of its own per family.
#include <cstdint>
#include <string>
#include <vector>

#include "worker/model_config.h"

namespace tessera {

struct ExpectedTensor {
  enum class Kind { kMatrix, kNorm, kBias };
  std::string name;
  std::vector<int64_t> shape;  // as stored (GPT-2's Conv1D weights: [in, out])
  Kind kind = Kind::kMatrix;
  TensorRole role = TensorRole::kCount;
};

// In checkpoint order: embeddings, then layer by layer, then the final norm and LM head.
// Biases follow their weight: LayerNorm biases always, linear biases for the roles in the
// row's `biases` list. Where a name has alternatives ("a|b"), the one this config's
// layout uses.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// Of a name pattern's alternatives ("a|b"), the one this config's layout uses: Falcon names
// its norms by layout (input_layernorm, + post_attention_layernorm when sequential; or
// ln_attn + ln_mlp in a parallel block with two norms), and the last alternative is the
// two-norm parallel one. Every other pattern has one alternative.
std::string layout_alternative(const std::string& pattern, const ModelConfig& config);

}  // namespace tessera
