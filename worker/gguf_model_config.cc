#include "worker/gguf_model_config.h"

#include <cmath>
#include <utility>

#include "common/gguf/gguf_file.h"
#include "worker/arch_spec.h"

namespace tessera {
namespace {

// Reads `<arch>.<key>` (optional ones may be absent) into config[json_key] when the row has
// a config.json key for it.
class GgufConfigWriter {
 public:
  GgufConfigWriter(const GgufFile& file, const std::string& arch, nlohmann::json* config)
      : file_(file), arch_(arch), config_(*config) {}

  std::string key(const std::string& k) const { return arch_ + "." + k; }
  bool has(const std::string& k) const { return file_.has(key(k)); }

  // A positive integer; per-layer arrays (some files give head counts per layer) must be
  // uniform, since one ModelConfig value serves every layer.
  StatusOr<int64_t> positive_int(const std::string& k) const {
    const GgufValue* v = file_.find(key(k));
    if (v != nullptr && v->type == GgufValueType::kArray) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> per_layer, file_.get_int_array(key(k)));
      for (int64_t x : per_layer) {
        if (per_layer.empty() || x != per_layer[0]) {
          return unimplemented(file_.path() + ": " + key(k) + " differs from layer to layer, which is not supported");
        }
      }
      if (per_layer.empty()) return invalid_argument(file_.path() + ": " + key(k) + " is an empty array");
      return check_positive(k, per_layer[0]);
    }
    TESSERA_ASSIGN_OR_RETURN(int64_t x, file_.get_int(key(k)));
    return check_positive(k, x);
  }

  // config[json_keys[0]] = <arch>.k; absent and required: NotFound naming the key.
  Status copy_int(const std::string& k, const std::vector<std::string>& json_keys, bool required) {
    if (!has(k)) return required ? not_found(file_.path() + ": missing metadata key " + key(k)) : Status::ok();
    if (json_keys.empty()) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(int64_t x, positive_int(k));
    config_[json_keys[0]] = x;
    return Status::ok();
  }
  Status copy_float(const std::string& k, const std::vector<std::string>& json_keys) {
    if (!has(k) || json_keys.empty()) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(double x, file_.get_float(key(k)));
    if (!std::isfinite(x)) return invalid_argument(file_.path() + ": " + key(k) + " is not a finite number");
    config_[json_keys[0]] = x;
    return Status::ok();
  }

 private:
  StatusOr<int64_t> check_positive(const std::string& k, int64_t x) const {
    if (x < 1 || x > (int64_t{1} << 40)) {
      return invalid_argument(file_.path() + ": " + key(k) + " = " + std::to_string(x) + " is not a positive size");
    }
    return x;
  }

  const GgufFile& file_;
  const std::string& arch_;
  nlohmann::json& config_;
};

// rope.scaling.* as transformers' rope_scaling object; model_config.cc refuses the types
// Tessera does not compute.
Status rope_scaling_from_gguf(const GgufFile& file, const std::string& arch, nlohmann::json* config) {
  const std::string type_key = arch + ".rope.scaling.type";
  if (!file.has(type_key)) return Status::ok();
  TESSERA_ASSIGN_OR_RETURN(std::string type, file.get_string(type_key));
  if (type == "none") return Status::ok();
  nlohmann::json rs = {{"rope_type", type}};
  if (file.has(arch + ".rope.scaling.factor")) {
    TESSERA_ASSIGN_OR_RETURN(double f, file.get_float(arch + ".rope.scaling.factor"));
    rs["factor"] = f;
  }
  if (file.has(arch + ".rope.scaling.original_context_length")) {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, file.get_int(arch + ".rope.scaling.original_context_length"));
    rs["original_max_position_embeddings"] = n;
  }
  if (type == "yarn") {
    // What the converter copies from transformers' yarn parameters, back under their names.
    for (const auto& [key, hf_key] : std::vector<std::pair<std::string, std::string>>{
             {"yarn_attn_factor", "attention_factor"}, {"yarn_beta_fast", "beta_fast"}, {"yarn_beta_slow", "beta_slow"}}) {
      if (!file.has(arch + ".rope.scaling." + key)) continue;
      TESSERA_ASSIGN_OR_RETURN(double v, file.get_float(arch + ".rope.scaling." + key));
      rs[hf_key] = v;
    }
    const std::string ext_key = arch + ".rope.scaling.yarn_ext_factor";
    if (file.has(ext_key)) {
      TESSERA_ASSIGN_OR_RETURN(double ext, file.get_float(ext_key));
      if (ext != 1.0) return unimplemented(file.path() + ": " + ext_key + " is " + std::to_string(ext) +
                                           ": YaRN with an extrapolation factor other than 1 is not supported");
    }
  }
  (*config)["rope_scaling"] = rs;
  return Status::ok();
}

}  // namespace

StatusOr<nlohmann::json> gguf_model_config(const GgufFile& file, const ArchSpec& row, const std::string& arch,
                                           int64_t vocab, bool tied, std::vector<std::string>* consumed) {
  nlohmann::json config = nlohmann::json::parse(row.config_extras);
  config["model_type"] = row.model_types.at(0);
  config["architectures"] = {row.hf_architecture};
  config["vocab_size"] = vocab;
  config["tie_word_embeddings"] = tied;
  const ConfigKeys& k = row.keys;
  GgufConfigWriter w(file, arch, &config);
  TESSERA_RETURN_IF_ERROR(w.copy_int("embedding_length", k.hidden, true));
  TESSERA_RETURN_IF_ERROR(w.copy_int("block_count", k.layers, true));
  TESSERA_RETURN_IF_ERROR(w.copy_int("attention.head_count", k.heads, true));
  TESSERA_RETURN_IF_ERROR(w.copy_int("attention.head_count_kv", k.kv_heads, false));
  TESSERA_RETURN_IF_ERROR(w.copy_int("feed_forward_length", k.ffn, !row.moe && row.ffn_multiple == 0));
  TESSERA_RETURN_IF_ERROR(w.copy_int("context_length", k.max_positions, false));
  TESSERA_RETURN_IF_ERROR(w.copy_float("rope.freq_base", k.rope_theta));
  TESSERA_RETURN_IF_ERROR(
      w.copy_float(row.norm == NormKind::kRmsNorm ? "attention.layer_norm_rms_epsilon" : "attention.layer_norm_epsilon",
                   k.norm_eps));
  // The head width: key_length where the file says it (Gemma, Qwen3: not hidden / heads).
  TESSERA_ASSIGN_OR_RETURN(int64_t hidden, w.positive_int("embedding_length"));
  TESSERA_ASSIGN_OR_RETURN(int64_t heads, w.positive_int("attention.head_count"));
  int64_t head_dim = hidden / heads;
  if (w.has("attention.key_length")) {
    TESSERA_ASSIGN_OR_RETURN(head_dim, w.positive_int("attention.key_length"));
    if (w.has("attention.value_length")) {
      TESSERA_ASSIGN_OR_RETURN(int64_t value_dim, w.positive_int("attention.value_length"));
      if (value_dim != head_dim) {
        return unimplemented(file.path() + ": " + w.key("attention.value_length") + " " + std::to_string(value_dim) +
                             " differs from " + w.key("attention.key_length") + " " + std::to_string(head_dim) +
                             ", which is not supported");
      }
    }
    if (!k.head_dim.empty()) {
      config[k.head_dim[0]] = head_dim;
    } else if (head_dim * heads != hidden) {
      return unimplemented(file.path() + ": " + w.key("attention.key_length") + " " + std::to_string(head_dim) +
                           " is not embedding_length / head_count, which " + row.name + " does not support");
    }
  }
  // Partial rotary: the rotated dims of each head.
  if (w.has("rope.dimension_count")) {
    TESSERA_ASSIGN_OR_RETURN(int64_t rot, w.positive_int("rope.dimension_count"));
    if (rot != head_dim) {
      if (k.rotary_fraction.empty() || rot > head_dim) {
        return unimplemented(file.path() + ": " + w.key("rope.dimension_count") + " " + std::to_string(rot) +
                             " differs from the head width " + std::to_string(head_dim) + ", which " + row.name +
                             " does not support");
      }
      config[k.rotary_fraction[0]] = static_cast<double>(rot) / static_cast<double>(head_dim);
    }
  }
  if (row.moe) {
    TESSERA_RETURN_IF_ERROR(w.copy_int("expert_count", k.experts, true));
    TESSERA_RETURN_IF_ERROR(w.copy_int("expert_used_count", {"num_experts_per_tok"}, true));
    TESSERA_RETURN_IF_ERROR(w.copy_int("expert_feed_forward_length", k.moe_ffn, false));
    if (row.shared_expert) {
      TESSERA_RETURN_IF_ERROR(w.copy_int("expert_shared_feed_forward_length", {"shared_expert_intermediate_size"}, true));
    }
  }
  // The vocabulary's own special ids (the tokenizer reads the same keys).
  for (const char* id : {"bos", "eos"}) {
    const std::string key = std::string("tokenizer.ggml.") + id + "_token_id";
    if (!file.has(key)) continue;
    TESSERA_ASSIGN_OR_RETURN(int64_t value, file.get_int(key));
    if (value < 0 || value >= vocab) {
      return invalid_argument(file.path() + ": " + key + " " + std::to_string(value) + " is outside the vocabulary of " +
                              std::to_string(vocab));
    }
    config[std::string(id) + "_token_id"] = value;
  }
  TESSERA_RETURN_IF_ERROR(rope_scaling_from_gguf(file, arch, &config));
  if (row.gguf_config != nullptr) TESSERA_RETURN_IF_ERROR(row.gguf_config(file, arch, &config, consumed));
  return config;
}

}  // namespace tessera
