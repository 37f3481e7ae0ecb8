#include "worker/model_config.h"

#include <nlohmann/json.hpp>

namespace tessera {
namespace {

// Finds the first of `keys` present in `config`; BLOOM's configs use both the new names
// (hidden_size, n_head) and old ones (n_embed, num_attention_heads) depending on their age.
const nlohmann::json* find_key(const nlohmann::json& config, std::initializer_list<const char*> keys,
                               std::string* found) {
  for (const char* k : keys) {
    auto it = config.find(k);
    if (it != config.end() && !it->is_null()) {
      *found = k;
      return &*it;
    }
  }
  return nullptr;
}

std::string key_list(std::initializer_list<const char*> keys) {
  std::string s;
  for (const char* k : keys) s += (s.empty() ? "\"" : "\" or \"") + std::string(k);
  return s + "\"";
}

Status read_int(const nlohmann::json& config, const std::string& source,
                std::initializer_list<const char*> keys, bool required, int64_t* out) {
  std::string key;
  const nlohmann::json* v = find_key(config, keys, &key);
  if (v == nullptr) {
    if (required) return invalid_argument(source + ": missing key " + key_list(keys));
    return Status::ok();
  }
  if (!v->is_number_integer() || v->get<int64_t>() <= 0) {
    return invalid_argument(source + ": key \"" + key + "\" must be a positive integer, got " + v->dump());
  }
  *out = v->get<int64_t>();
  return Status::ok();
}

Status read_float(const nlohmann::json& config, const std::string& source,
                  std::initializer_list<const char*> keys, float* out) {
  std::string key;
  const nlohmann::json* v = find_key(config, keys, &key);
  if (v == nullptr) return Status::ok();
  if (!v->is_number() || v->get<double>() <= 0) {
    return invalid_argument(source + ": key \"" + key + "\" must be a positive number, got " + v->dump());
  }
  *out = v->get<float>();
  return Status::ok();
}

}  // namespace

StatusOr<ModelConfig> parse_model_config(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) return invalid_argument(source + ": expected a JSON object");
  ModelConfig c;
  auto mt = config.find("model_type");
  if (mt == config.end() || !mt->is_string()) {
    return invalid_argument(source + ": missing string key \"model_type\" (supported: " +
                            supported_model_types() + ")");
  }
  c.model_type = mt->get<std::string>();
  c.arch = find_arch_spec(c.model_type);
  if (c.arch == nullptr) {
    return unimplemented(source + ": unknown model_type \"" + c.model_type +
                         "\" (supported: " + supported_model_types() + ")");
  }
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"hidden_size", "n_embed", "d_model"}, true, &c.hidden));
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"num_hidden_layers", "n_layer"}, true, &c.layers));
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"num_attention_heads", "n_head"}, true, &c.heads));
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"vocab_size"}, true, &c.vocab));
  c.kv_heads = c.heads;
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"num_key_value_heads"}, false, &c.kv_heads));
  if (c.hidden % c.heads != 0 && config.find("head_dim") == config.end()) {
    return invalid_argument(source + ": hidden size " + std::to_string(c.hidden) +
                            " is not divisible by the number of heads " + std::to_string(c.heads));
  }
  c.head_dim = c.hidden / c.heads;
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"head_dim"}, false, &c.head_dim));
  if (c.heads % c.kv_heads != 0) {
    return invalid_argument(source + ": num_attention_heads " + std::to_string(c.heads) +
                            " is not a multiple of num_key_value_heads " + std::to_string(c.kv_heads));
  }
  if (c.arch->position == PositionKind::kRotary && c.head_dim % 2 != 0) {
    return invalid_argument(source + ": rotary embeddings need an even head_dim, got " +
                            std::to_string(c.head_dim));
  }
  if (c.arch->mlp == MlpKind::kGeluDense) {
    c.ffn = 4 * c.hidden;  // BLOOM's MLP is always 4h
  } else {
    TESSERA_RETURN_IF_ERROR(read_int(config, source, {"intermediate_size"}, true, &c.ffn));
  }
  if (c.arch->norm == NormKind::kLayerNorm) {
    TESSERA_RETURN_IF_ERROR(read_float(config, source, {"layer_norm_epsilon", "layer_norm_eps"}, &c.norm_eps));
  } else {
    TESSERA_RETURN_IF_ERROR(read_float(config, source, {"rms_norm_eps"}, &c.norm_eps));
  }
  if (c.arch->position == PositionKind::kRotary) {
    TESSERA_RETURN_IF_ERROR(read_float(config, source, {"rope_theta"}, &c.rope_theta));
    auto rs = config.find("rope_scaling");
    if (rs != config.end() && !rs->is_null()) {
      std::string type = rs->is_object() ? rs->value("rope_type", rs->value("type", std::string("?"))) : "?";
      if (type != "default") {
        return unimplemented(source + ": rope_scaling of type \"" + type + "\" is not supported yet");
      }
    }
  }
  TESSERA_RETURN_IF_ERROR(read_int(config, source, {"max_position_embeddings", "n_positions"}, false,
                                   &c.max_positions));
  if (c.arch->mlp == MlpKind::kMoeSwiGlu) {
    TESSERA_RETURN_IF_ERROR(read_int(config, source, {"num_local_experts", "num_experts"}, true, &c.num_experts));
    TESSERA_RETURN_IF_ERROR(read_int(config, source, {"num_experts_per_tok"}, true, &c.top_k));
    if (c.top_k > c.num_experts) {
      return invalid_argument(source + ": num_experts_per_tok " + std::to_string(c.top_k) +
                              " exceeds num_local_experts " + std::to_string(c.num_experts));
    }
  }
  c.tie_embeddings = c.arch->tie_embeddings_default;
  if (auto it = config.find("tie_word_embeddings"); it != config.end() && it->is_boolean()) {
    c.tie_embeddings = it->get<bool>();
  }
  if (config.value("apply_residual_connection_post_layernorm", false)) {
    return unimplemented(source + ": apply_residual_connection_post_layernorm=true is not supported");
  }
  // Sliding-window attention equals full attention while a sequence fits in the window, so
  // such models are served with their context capped at the window.
  if (auto it = config.find("sliding_window"); it != config.end() && it->is_number_integer() &&
                                               it->get<int64_t>() > 0) {
    const int64_t window = it->get<int64_t>();
    if (c.max_positions == 0 || c.max_positions > window) c.max_positions = window;
  }
  if (auto it = config.find("bos_token_id"); it != config.end() && it->is_number_integer()) c.bos_id = it->get<int32_t>();
  if (auto it = config.find("eos_token_id"); it != config.end() && it->is_number_integer()) c.eos_id = it->get<int32_t>();
  return c;
}

Status check_prompt(const std::vector<int32_t>& prompt, int max_new_tokens, const ModelConfig& c,
                    const std::string& who) {
  if (prompt.empty()) return invalid_argument(who + ": the prompt is empty");
  if (max_new_tokens < 1) return invalid_argument(who + ": max_new_tokens must be at least 1");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab) {
      return invalid_argument(who + ": prompt id " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
    }
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  if (c.max_positions > 0 && c.arch->position == PositionKind::kRotary && total > c.max_positions) {
    return invalid_argument(who + ": " + std::to_string(prompt.size()) + " prompt tokens + " +
                            std::to_string(max_new_tokens) + " new tokens exceed the model's context of " +
                            std::to_string(c.max_positions));
  }
  return Status::ok();
}

}  // namespace tessera
