#include "worker/model_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "worker/config_fields.h"

namespace tessera {
namespace {

namespace cf = config_fields;

// A list of positive finite factors under `key` of rope_scaling.
Status read_rope_factors(const nlohmann::json& rs, const std::string& where, const char* key, std::vector<float>* out) {
  auto it = rs.find(key);
  if (it == rs.end()) return invalid_argument(where + ": missing key \"" + std::string(key) + "\"");
  if (!it->is_array() || it->empty()) {
    return invalid_argument(where + ": \"" + std::string(key) + "\" must be a non-empty list of numbers, got " +
                            it->dump().substr(0, 80));
  }
  out->clear();
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& v = (*it)[i];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
      return invalid_argument(where + ": " + key + "[" + std::to_string(i) + "] must be a positive number, got " +
                              v.dump());
    }
    out->push_back(v.get<float>());
  }
  return Status::ok();
}

// longrope / su (transformers' _compute_longrope_parameters): original_max_position_embeddings
// from the config's top level (Phi-3 keeps it there, and then factor = max_position_embeddings
// / it) or from rope_scaling (with its factor); attention_factor given, else
// sqrt(1 + ln(factor) / ln(original)) above a factor of 1.
Status parse_longrope(const nlohmann::json& config, const nlohmann::json& rs, const std::string& where, ModelConfig* c) {
  RopeScaling& s = c->rope_scaling;
  s.kind = RopeScaling::Kind::kLongRope;
  TESSERA_RETURN_IF_ERROR(read_rope_factors(rs, where, "short_factor", &s.short_factor));
  TESSERA_RETURN_IF_ERROR(read_rope_factors(rs, where, "long_factor", &s.long_factor));
  if (s.short_factor.size() != s.long_factor.size()) {
    return invalid_argument(where + ": short_factor has " + std::to_string(s.short_factor.size()) +
                            " entries and long_factor " + std::to_string(s.long_factor.size()));
  }
  const nlohmann::json* top = cf::find(config, {"original_max_position_embeddings"});
  if (top != nullptr && !top->is_null()) {
    TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, where, {"original_max_position_embeddings"}, true,
                                                  &s.original_max_positions));
    if (c->max_positions == 0) {
      return invalid_argument(where + ": original_max_position_embeddings needs max_position_embeddings beside it");
    }
    s.factor = static_cast<float>(static_cast<double>(c->max_positions) / static_cast<double>(s.original_max_positions));
  } else {
    if (cf::find(rs, {"original_max_position_embeddings"}) == nullptr && c->max_positions == 0) {
      return invalid_argument(where + ": missing key \"original_max_position_embeddings\"");
    }
    s.original_max_positions = c->max_positions;
    TESSERA_RETURN_IF_ERROR(
        cf::read_positive_int(rs, where, {"original_max_position_embeddings"}, false, &s.original_max_positions));
    if (cf::find(rs, {"factor"}) == nullptr) return invalid_argument(where + ": missing key \"factor\"");
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(rs, where, {"factor"}, &s.factor));
  }
  const nlohmann::json* given = cf::find(rs, {"attention_factor"});
  if (given != nullptr && !given->is_null()) {
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(rs, where, {"attention_factor"}, &s.attention_factor));
  } else if (s.factor > 1.0f && s.original_max_positions > 1) {
    s.attention_factor = static_cast<float>(
        std::sqrt(1.0 + std::log(static_cast<double>(s.factor)) / std::log(static_cast<double>(s.original_max_positions))));
  }
  return Status::ok();
}

// yarn (transformers' _compute_yarn_parameters): factor, original_max_position_embeddings
// (else max_position_embeddings), beta_fast / beta_slow, truncate; attention_factor given, else
// (0.1 mscale ln f + 1) / (0.1 mscale_all_dim ln f + 1) with both given (DeepSeek), else
// 0.1 ln f + 1 above a factor of 1. The factor is rope_scaling's own, as vLLM and llama.cpp
// take it (recent transformers divide max_position_embeddings by the original instead when
// rope_scaling names one; the released Qwen configs leave the two equal, which would undo it).
Status parse_yarn(const nlohmann::json& rs, const std::string& where, ModelConfig* c) {
  RopeScaling& s = c->rope_scaling;
  s.kind = RopeScaling::Kind::kYarn;
  if (cf::find(rs, {"factor"}) == nullptr) return invalid_argument(where + ": missing key \"factor\"");
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(rs, where, {"factor"}, &s.factor));
  s.original_max_positions = c->max_positions;
  TESSERA_RETURN_IF_ERROR(
      cf::read_positive_int(rs, where, {"original_max_position_embeddings"}, s.original_max_positions == 0,
                            &s.original_max_positions));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(rs, where, {"beta_fast"}, &s.beta_fast));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(rs, where, {"beta_slow"}, &s.beta_slow));
  TESSERA_RETURN_IF_ERROR(cf::read_bool(rs, where, {"truncate"}, &s.truncate));
  auto mscale = [&](double m) { return s.factor <= 1.0f ? 1.0 : 0.1 * m * std::log(static_cast<double>(s.factor)) + 1.0; };
  const nlohmann::json* given = cf::find(rs, {"attention_factor"});
  const nlohmann::json* m = cf::find(rs, {"mscale"});
  const nlohmann::json* m_all = cf::find(rs, {"mscale_all_dim"});
  if (given != nullptr && !given->is_null()) {
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(rs, where, {"attention_factor"}, &s.attention_factor));
  } else if (m != nullptr && m_all != nullptr && m->is_number() && m_all->is_number() && m->get<double>() != 0 &&
             m_all->get<double>() != 0) {
    s.attention_factor = static_cast<float>(mscale(m->get<double>()) / mscale(m_all->get<double>()));
  } else {
    s.attention_factor = static_cast<float>(mscale(1.0));
  }
  return Status::ok();
}

Status parse_rope_scaling(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  auto rs = config.find("rope_scaling");
  if (rs == config.end() || rs->is_null()) return Status::ok();
  if (!rs->is_object()) return invalid_argument(source + ": \"rope_scaling\" must be an object or null, got " + rs->dump());
  std::string type;
  TESSERA_RETURN_IF_ERROR(cf::read_string(*rs, source + " rope_scaling", {"rope_type", "type"}, &type));
  RopeScaling& s = c->rope_scaling;
  if (type.empty() || type == "default") return Status::ok();
  const std::string where = source + " rope_scaling";
  if (type == "linear" || type == "llama3") {
    if (cf::find(*rs, {"factor"}) == nullptr) return invalid_argument(where + ": missing key \"factor\"");
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(*rs, where, {"factor"}, &s.factor));
  }
  if (type == "linear") {
    s.kind = RopeScaling::Kind::kLinear;
    return Status::ok();
  }
  if (type == "llama3") {
    s.kind = RopeScaling::Kind::kLlama3;
    for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (cf::find(*rs, {key}) == nullptr) return invalid_argument(where + ": missing key \"" + std::string(key) + "\"");
    }
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(*rs, where, {"low_freq_factor"}, &s.low_freq_factor));
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(*rs, where, {"high_freq_factor"}, &s.high_freq_factor));
    TESSERA_RETURN_IF_ERROR(
        cf::read_positive_int(*rs, where, {"original_max_position_embeddings"}, true, &s.original_max_positions));
    if (s.high_freq_factor <= s.low_freq_factor) {
      return invalid_argument(where + ": high_freq_factor must exceed low_freq_factor");
    }
    return Status::ok();
  }
  if (type == "longrope" || type == "su") return parse_longrope(config, *rs, where, c);
  if (type == "yarn") return parse_yarn(*rs, where, c);
  return unimplemented(source + ": rope_scaling of type \"" + type +
                       "\" is not supported (supported: default, linear, llama3, longrope, yarn)");
}

Status parse_moe(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  const ArchSpec& a = *c->arch;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, a.keys.experts, true, &c->num_experts));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"num_experts_per_tok"}, true, &c->top_k));
  if (c->top_k > c->num_experts) {
    return invalid_argument(source + ": num_experts_per_tok " + std::to_string(c->top_k) + " exceeds the " +
                            std::to_string(c->num_experts) + " experts");
  }
  c->moe_ffn = c->ffn;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, a.keys.moe_ffn, false, &c->moe_ffn));
  c->moe_normalize = a.moe_normalize;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"norm_topk_prob"}, &c->moe_normalize));
  if (a.shared_expert) {
    TESSERA_RETURN_IF_ERROR(
        cf::read_positive_int(config, source, {"shared_expert_intermediate_size"}, true, &c->shared_ffn));
  }
  // transformers (Qwen2/3-MoE): layer l is sparse iff it is not in mlp_only_layers and
  // (l + 1) % decoder_sparse_step == 0. Mixtral has neither key: every layer is sparse.
  int64_t step = 1;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"decoder_sparse_step"}, false, &step));
  std::set<int64_t> dense;
  if (const nlohmann::json* only = cf::find(config, {"mlp_only_layers"})) {
    if (!only->is_array()) return invalid_argument(source + ": \"mlp_only_layers\" must be a list of layer indices");
    for (const auto& v : *only) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c->layers) {
        return invalid_argument(source + ": \"mlp_only_layers\" holds " + v.dump() + ", not a layer index below " +
                                std::to_string(c->layers));
      }
      dense.insert(v.get<int64_t>());
    }
  }
  for (int64_t l = 0; l < c->layers; ++l) c->layer[l].moe = dense.count(l) == 0 && (l + 1) % step == 0;
  return Status::ok();
}

// Which layers have a sliding window: an explicit "layer_types" list (newer configs), else
// the row's rule applied to "sliding_window".
Status parse_windows(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  const ArchSpec& a = *c->arch;
  int64_t window = 0;
  TESSERA_RETURN_IF_ERROR(cf::read_int(config, source, {"sliding_window"}, &window));
  if (a.windows == WindowLayers::kNone || window == 0) {
    if (a.windows == WindowLayers::kNone && window > 0) {
      return unimplemented(source + ": \"sliding_window\" is not supported for model_type \"" + c->model_type + "\"");
    }
    return Status::ok();
  }
  if (window > (int64_t{1} << 30)) return invalid_argument(source + ": \"sliding_window\" " + std::to_string(window) + " is too large");
  std::vector<bool> sliding(c->layers, false);
  if (const nlohmann::json* types = cf::find(config, {"layer_types"})) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != c->layers) {
      return invalid_argument(source + ": \"layer_types\" must list one type per layer (" + std::to_string(c->layers) + ")");
    }
    for (int64_t l = 0; l < c->layers; ++l) {
      const nlohmann::json& t = (*types)[l];
      if (t == "sliding_attention") {
        sliding[l] = true;
      } else if (t != "full_attention") {
        return unimplemented(source + ": layer_types[" + std::to_string(l) + "] is " + t.dump() +
                             " (supported: \"full_attention\", \"sliding_attention\")");
      }
    }
  } else {
    int64_t pattern = 6, first = 28;
    bool use = false;
    switch (a.windows) {
      case WindowLayers::kAll: sliding.assign(c->layers, true); break;
      case WindowLayers::kEven:
        for (int64_t l = 0; l < c->layers; ++l) sliding[l] = l % 2 == 0;
        break;
      case WindowLayers::kPattern:
        TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"sliding_window_pattern"}, false, &pattern));
        for (int64_t l = 0; l < c->layers; ++l) sliding[l] = (l + 1) % pattern != 0;
        break;
      case WindowLayers::kFromLayer:
        TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"use_sliding_window"}, &use));
        TESSERA_RETURN_IF_ERROR(cf::read_int(config, source, {"max_window_layers"}, &first));
        for (int64_t l = 0; l < c->layers; ++l) sliding[l] = use && l >= first;
        break;
      case WindowLayers::kNone: break;
    }
  }
  for (int64_t l = 0; l < c->layers; ++l) c->layer[l].window = sliding[l] ? static_cast<int32_t>(window) : 0;
  return Status::ok();
}

Status parse_activation(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  const ArchSpec& a = *c->arch;
  c->activation = a.activation;
  if (a.keys.activation.empty()) return Status::ok();
  std::string key;
  const nlohmann::json* v = cf::find(config, a.keys.activation, &key);
  if (v == nullptr) return Status::ok();
  if (!v->is_string()) return invalid_argument(source + ": key \"" + key + "\" must be a string, got " + v->dump());
  if (!activation_from_name(v->get<std::string>(), &c->activation)) {
    return unimplemented(source + ": activation \"" + v->get<std::string>() + "\" (key \"" + key +
                         "\") is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, silu)");
  }
  return Status::ok();
}

Status parse_rotary(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  const ArchSpec& a = *c->arch;
  if (a.position != PositionKind::kRotary) return Status::ok();
  c->rope_theta = a.rope_theta;
  if (!a.keys.rope_theta.empty()) {
    TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, a.keys.rope_theta, &c->rope_theta));
  }
  TESSERA_RETURN_IF_ERROR(parse_rope_scaling(config, source, c));
  c->rotary_dim = c->head_dim;
  std::string key;
  if (const nlohmann::json* f = cf::find(config, a.keys.rotary_fraction, &key)) {
    if (!f->is_number() || f->get<double>() <= 0 || f->get<double>() > 1) {
      return invalid_argument(source + ": key \"" + key + "\" must be in (0, 1], got " + f->dump());
    }
    // transformers: int(head_dim * fraction).
    c->rotary_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * f->get<double>());
  }
  if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0) {
    return invalid_argument(source + ": rotary embeddings need an even number of rotated dims, got " +
                            std::to_string(c->rotary_dim) + " of head_dim " + std::to_string(c->head_dim));
  }
  const RopeScaling& s = c->rope_scaling;
  if (s.kind == RopeScaling::Kind::kLongRope && static_cast<int64_t>(s.short_factor.size()) != c->rotary_dim / 2) {
    return invalid_argument(source + " rope_scaling: short_factor and long_factor have " +
                            std::to_string(s.short_factor.size()) + " entries, one per rotated pair needs " +
                            std::to_string(c->rotary_dim / 2) + " (rotary dims " + std::to_string(c->rotary_dim) + ")");
  }
  return Status::ok();
}

// bos_token_id / eos_token_id: an id, a list of ids (Llama 3 lists several end-of-sequence
// ids; the first is the one a plain completion ends on) or null. An id outside the
// vocabulary could never be produced: a stop that never fires, refused at load.
Status read_token_id(const nlohmann::json& config, const std::string& source, const char* key, int64_t vocab,
                     int32_t* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return Status::ok();
  const nlohmann::json ids = it->is_array() ? *it : nlohmann::json::array({*it});
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string where = source + ": " + key + (it->is_array() ? "[" + std::to_string(i) + "]" : "");
    if (!ids[i].is_number_integer()) return invalid_argument(where + ": expected a token id (an integer), got " + ids[i].dump());
    const int64_t id = ids[i].get<int64_t>();
    if (id < 0 || id >= vocab) {
      return invalid_argument(where + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
    }
  }
  if (!ids.empty()) *out = ids[0].get<int32_t>();
  return Status::ok();
}

}  // namespace

int32_t ModelConfig::kv_window() const {
  int32_t w = 0;
  for (const LayerSpec& l : layer) {
    if (l.window == 0) return 0;
    w = std::max(w, l.window);
  }
  return w;
}

StatusOr<ModelConfig> parse_model_config(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) return invalid_argument(source + ": expected a JSON object");
  ModelConfig c;
  auto mt = config.find("model_type");
  if (mt == config.end() || !mt->is_string()) {
    return invalid_argument(source + ": missing string key \"model_type\" (supported: " + supported_model_types() + ")");
  }
  c.model_type = mt->get<std::string>();
  c.arch = find_arch_spec(c.model_type);
  if (c.arch == nullptr) {
    return unimplemented(source + ": unknown model_type \"" + c.model_type + "\" (supported: " +
                         supported_model_types() + ")");
  }
  const ArchSpec& a = *c.arch;
  const ConfigKeys& k = a.keys;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.hidden, true, &c.hidden));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.layers, true, &c.layers));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.heads, true, &c.heads));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"vocab_size"}, true, &c.vocab));
  if (c.layers > 100000) return invalid_argument(source + ": " + std::to_string(c.layers) + " layers is not a model");
  c.kv_heads = c.heads;
  if (!k.kv_heads.empty()) TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.kv_heads, false, &c.kv_heads));
  if (c.hidden % c.heads != 0 && cf::find(config, k.head_dim) == nullptr) {
    return invalid_argument(source + ": hidden size " + std::to_string(c.hidden) +
                            " is not divisible by the number of heads " + std::to_string(c.heads));
  }
  c.head_dim = c.hidden / c.heads;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.head_dim, false, &c.head_dim));
  c.ffn = a.ffn_multiple * c.hidden;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.ffn, a.ffn_multiple == 0, &c.ffn));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, k.norm_eps, &c.norm_eps));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, k.max_positions, false, &c.max_positions));
  c.qkv = a.qkv;
  c.block = a.block;
  c.mlp_norm = !a.name_of(TensorRole::kMlpNorm).empty();
  c.layer.assign(c.layers, LayerSpec{});
  for (LayerSpec& l : c.layer) l.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  TESSERA_RETURN_IF_ERROR(parse_activation(config, source, &c));
  TESSERA_RETURN_IF_ERROR(parse_rotary(config, source, &c));
  if (a.moe) TESSERA_RETURN_IF_ERROR(parse_moe(config, source, &c));
  TESSERA_RETURN_IF_ERROR(parse_windows(config, source, &c));
  c.tie_embeddings = a.tie_embeddings_default;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"tie_word_embeddings"}, &c.tie_embeddings));
  TESSERA_RETURN_IF_ERROR(read_token_id(config, source, "bos_token_id", c.vocab, &c.bos_id));
  TESSERA_RETURN_IF_ERROR(read_token_id(config, source, "eos_token_id", c.vocab, &c.eos_id));
  if (a.adapt != nullptr) TESSERA_RETURN_IF_ERROR(a.adapt(config, source, &c));
  // Checked after the family's own fields, which may set the KV heads (Falcon).
  if (c.heads % c.kv_heads != 0) {
    return invalid_argument(source + ": num_attention_heads " + std::to_string(c.heads) +
                            " is not a multiple of num_key_value_heads " + std::to_string(c.kv_heads));
  }
  if (a.position == PositionKind::kLearned && c.max_positions == 0) {
    return invalid_argument(source + ": learned position embeddings need " + config_fields::key_list(k.max_positions));
  }
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
  if (c.max_positions > 0 && c.arch->position != PositionKind::kAlibi && total > c.max_positions) {
    return invalid_argument(who + ": " + std::to_string(prompt.size()) + " prompt tokens + " +
                            std::to_string(max_new_tokens) + " new tokens exceed the model's context of " +
                            std::to_string(c.max_positions));
  }
  return Status::ok();
}

namespace {

// Gemma 3's sliding layers: their own RoPE base, never scaled.
bool uses_local_rope(const ModelConfig& c, int layer) { return c.layer[layer].local_rope && c.rope_local_theta > 0; }

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& c, int layer) {
  const bool local = uses_local_rope(c, layer);
  const float theta = local ? c.rope_local_theta : c.rope_theta;
  const int64_t dim = c.rotary_dim, half = dim / 2;
  // transformers' float32 formula: 1 / theta ** (arange(0, dim, 2).float() / dim); the scalings
  // below start from the same base frequencies theta ** (2i / dim).
  std::vector<float> base(half), inv(half);
  for (int64_t i = 0; i < half; ++i) {
    base[i] = std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    inv[i] = 1.0f / base[i];
  }
  const RopeScaling& s = c.rope_scaling;
  if (local || s.kind == RopeScaling::Kind::kNone) return inv;
  if (s.kind == RopeScaling::Kind::kLongRope) {
    // 1 / (ext_factors * base), in float32.
    const std::vector<float>& ext = rope_uses_long_factors(c) ? s.long_factor : s.short_factor;
    for (int64_t i = 0; i < half; ++i) inv[i] = 1.0f / (ext[i] * base[i]);
    return inv;
  }
  if (s.kind == RopeScaling::Kind::kLinear) {
    for (float& f : inv) f /= s.factor;
    return inv;
  }
  if (s.kind == RopeScaling::Kind::kYarn) {
    // The pair index at which a frequency turns `rotations` times over the original context.
    auto correction_dim = [&](double rotations) {
      return static_cast<double>(dim) * std::log(static_cast<double>(s.original_max_positions) / (rotations * 2.0 * M_PI)) /
             (2.0 * std::log(static_cast<double>(theta)));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      // The base frequency kept (extrapolation) where the ramp is 0, divided by factor
      // (interpolation) where it is 1; float32 as transformers computes it.
      const float ramp =
          std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
      const float extrapolation = 1.0f - ramp;
      inv[i] = 1.0f / (s.factor * base[i]) * (1.0f - extrapolation) + inv[i] * extrapolation;
    }
    return inv;
  }
  // llama3 (_compute_llama3_parameters): long wavelengths divided by factor, short ones
  // kept, those between interpolated.
  const float old_ctx = static_cast<float>(s.original_max_positions);
  const float low_wavelen = old_ctx / s.low_freq_factor;
  const float high_wavelen = old_ctx / s.high_freq_factor;
  const float two_pi = static_cast<float>(2.0 * M_PI);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_wavelen ? f / s.factor : f;
    if (wavelen < high_wavelen || wavelen > low_wavelen) {
      f = scaled;
      continue;
    }
    const float smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = (1.0f - smooth) * scaled / s.factor + smooth * scaled;
  }
  return inv;
}

bool rope_uses_long_factors(const ModelConfig& c) {
  const int64_t context = c.served_context > 0 ? c.served_context : c.max_positions;
  return c.rope_scaling.kind == RopeScaling::Kind::kLongRope && context > c.rope_scaling.original_max_positions;
}

float rope_magnitude(const ModelConfig& c, int layer) {
  const bool local = uses_local_rope(c, layer);
  const bool scaled = c.rope_scaling.kind == RopeScaling::Kind::kLongRope || c.rope_scaling.kind == RopeScaling::Kind::kYarn;
  return !local && scaled ? c.rope_scaling.attention_factor : 1.0f;
}

}  // namespace tessera
