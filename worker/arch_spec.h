#pragma once
// An architecture is a row in a table, not a class: BLOOM, Llama and Mixtral differ in a
// handful of switches (norm, positions, QKV packing, MLP kind) and in tensor names. One
// transformer block (worker/transformer.cc) reads these switches; adding a model family
// means adding a row here plus a loader test.
#include <array>
#include <string>
#include <vector>

namespace tessera {

enum class NormKind { kLayerNorm, kRmsNorm };
enum class PositionKind { kRotary, kAlibi };
// kSeparate: q_proj, k_proj, v_proj. kFusedPerHead: one [heads * 3 * head_dim, hidden]
// weight whose rows are ordered [head, (q|k|v), head_dim] (BLOOM).
enum class QkvLayout { kSeparate, kFusedPerHead };
enum class MlpKind { kGeluDense, kSwiGlu, kMoeSwiGlu };

// Every weight a transformer can have. Patterns below name them per architecture.
enum class TensorRole {
  kEmbed,
  kEmbedNorm,
  kFinalNorm,
  kLmHead,
  kAttnNorm,
  kQ,
  kK,
  kV,
  kQkv,
  kO,
  kMlpNorm,
  kGate,     // SwiGLU gate (silu branch); Mixtral expert w1
  kUp,       // SwiGLU up / dense h->4h; Mixtral expert w3
  kDown,     // down / dense 4h->h; Mixtral expert w2
  kRouter,
  kCount
};
const char* tensor_role_name(TensorRole role);

struct ArchSpec {
  std::string name;                      // "llama"
  std::vector<std::string> model_types;  // config.json "model_type" values served by this row
  NormKind norm = NormKind::kRmsNorm;
  PositionKind position = PositionKind::kRotary;
  QkvLayout qkv = QkvLayout::kSeparate;
  MlpKind mlp = MlpKind::kSwiGlu;
  bool embedding_norm = false;          // BLOOM's word_embeddings_layernorm
  bool tie_embeddings_default = false;  // when config.json has no tie_word_embeddings
  // Weight tensor names: "{L}" is the layer index, "{E}" the expert index. Norm and linear
  // biases are the same name with ".weight" replaced by ".bias"; a bias is loaded when the
  // checkpoint has it. Empty means the architecture has no such tensor.
  std::array<std::string, static_cast<size_t>(TensorRole::kCount)> names;

  const std::string& name_of(TensorRole role) const { return names[static_cast<size_t>(role)]; }
};

// The built-in table.
const std::vector<ArchSpec>& arch_specs();
// Row serving config.json's model_type; nullptr when none does.
const ArchSpec* find_arch_spec(const std::string& model_type);
// "bloom, llama, mistral, mixtral" — for error messages.
std::string supported_model_types();

// Expands "{L}" and "{E}" in a pattern.
std::string tensor_name(const std::string& pattern, int layer, int expert = -1);
// "x.weight" -> "x.bias".
std::string bias_name(const std::string& weight_name);

}  // namespace tessera
