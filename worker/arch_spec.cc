#include "worker/arch_spec.h"

#include "common/string_util.h"

namespace tessera {
namespace {

ArchSpec make_bloom() {
  ArchSpec s;
  s.name = "bloom";
  s.model_types = {"bloom"};
  s.norm = NormKind::kLayerNorm;
  s.position = PositionKind::kAlibi;
  s.qkv = QkvLayout::kFusedPerHead;
  s.mlp = MlpKind::kGeluDense;
  s.embedding_norm = true;
  s.tie_embeddings_default = true;
  auto& n = s.names;
  n[size_t(TensorRole::kEmbed)] = "transformer.word_embeddings.weight";
  n[size_t(TensorRole::kEmbedNorm)] = "transformer.word_embeddings_layernorm.weight";
  n[size_t(TensorRole::kFinalNorm)] = "transformer.ln_f.weight";
  n[size_t(TensorRole::kLmHead)] = "lm_head.weight";
  n[size_t(TensorRole::kAttnNorm)] = "transformer.h.{L}.input_layernorm.weight";
  n[size_t(TensorRole::kQkv)] = "transformer.h.{L}.self_attention.query_key_value.weight";
  n[size_t(TensorRole::kO)] = "transformer.h.{L}.self_attention.dense.weight";
  n[size_t(TensorRole::kMlpNorm)] = "transformer.h.{L}.post_attention_layernorm.weight";
  n[size_t(TensorRole::kUp)] = "transformer.h.{L}.mlp.dense_h_to_4h.weight";
  n[size_t(TensorRole::kDown)] = "transformer.h.{L}.mlp.dense_4h_to_h.weight";
  return s;
}

ArchSpec make_llama() {
  ArchSpec s;
  s.name = "llama";
  s.model_types = {"llama", "mistral"};
  auto& n = s.names;
  n[size_t(TensorRole::kEmbed)] = "model.embed_tokens.weight";
  n[size_t(TensorRole::kFinalNorm)] = "model.norm.weight";
  n[size_t(TensorRole::kLmHead)] = "lm_head.weight";
  n[size_t(TensorRole::kAttnNorm)] = "model.layers.{L}.input_layernorm.weight";
  n[size_t(TensorRole::kQ)] = "model.layers.{L}.self_attn.q_proj.weight";
  n[size_t(TensorRole::kK)] = "model.layers.{L}.self_attn.k_proj.weight";
  n[size_t(TensorRole::kV)] = "model.layers.{L}.self_attn.v_proj.weight";
  n[size_t(TensorRole::kO)] = "model.layers.{L}.self_attn.o_proj.weight";
  n[size_t(TensorRole::kMlpNorm)] = "model.layers.{L}.post_attention_layernorm.weight";
  n[size_t(TensorRole::kGate)] = "model.layers.{L}.mlp.gate_proj.weight";
  n[size_t(TensorRole::kUp)] = "model.layers.{L}.mlp.up_proj.weight";
  n[size_t(TensorRole::kDown)] = "model.layers.{L}.mlp.down_proj.weight";
  return s;
}

ArchSpec make_mixtral() {
  ArchSpec s = make_llama();
  s.name = "mixtral";
  s.model_types = {"mixtral"};
  s.mlp = MlpKind::kMoeSwiGlu;
  auto& n = s.names;
  n[size_t(TensorRole::kRouter)] = "model.layers.{L}.block_sparse_moe.gate.weight";
  n[size_t(TensorRole::kGate)] = "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight";
  n[size_t(TensorRole::kUp)] = "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight";
  n[size_t(TensorRole::kDown)] = "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight";
  return s;
}

}  // namespace

const char* tensor_role_name(TensorRole role) {
  static const char* kNames[] = {"embed",  "embed_norm", "final_norm", "lm_head", "attn_norm",
                                 "q",      "k",          "v",          "qkv",     "o",
                                 "mlp_norm", "gate",     "up",         "down",    "router"};
  return kNames[static_cast<size_t>(role)];
}

const std::vector<ArchSpec>& arch_specs() {
  static const std::vector<ArchSpec> specs = {make_bloom(), make_llama(), make_mixtral()};
  return specs;
}

const ArchSpec* find_arch_spec(const std::string& model_type) {
  for (const ArchSpec& spec : arch_specs()) {
    for (const std::string& t : spec.model_types) {
      if (t == model_type) return &spec;
    }
  }
  return nullptr;
}

std::string supported_model_types() {
  std::string out;
  for (const ArchSpec& spec : arch_specs()) {
    for (const std::string& t : spec.model_types) out += (out.empty() ? "" : ", ") + t;
  }
  return out;
}

std::string tensor_name(const std::string& pattern, int layer, int expert) {
  std::string s = replace_all(pattern, "{L}", std::to_string(layer));
  return expert >= 0 ? replace_all(s, "{E}", std::to_string(expert)) : s;
}

std::string bias_name(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() >= suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return weight_name.substr(0, weight_name.size() - suffix.size()) + ".bias";
  }
  return weight_name + ".bias";
}

}  // namespace tessera
