#include "worker/arch_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/gguf/ggml_dequant.h"
#include "common/gguf/gguf_file.h"

namespace tessera {
namespace {

// config[json_key] = <arch>.<key> when the file has it (floats, integers or booleans alike).
Status copy_key(const GgufFile& file, const std::string& key, const std::string& json_key, nlohmann::json* config) {
  const GgufValue* v = file.find(key);
  if (v == nullptr) return Status::ok();
  switch (v->type) {
    case GgufValueType::kF32: case GgufValueType::kF64: {
      TESSERA_ASSIGN_OR_RETURN(double x, file.get_float(key));
      (*config)[json_key] = x;
      return Status::ok();
    }
    case GgufValueType::kBool: {
      TESSERA_ASSIGN_OR_RETURN(bool b, file.get_bool(key));
      (*config)[json_key] = b;
      return Status::ok();
    }
    default: {
      TESSERA_ASSIGN_OR_RETURN(int64_t i, file.get_int(key));
      (*config)[json_key] = i;
      return Status::ok();
    }
  }
}

// The MLP activation of a GGUF Falcon or GPT-NeoX. The file names none; llama.cpp, whose
// graph defines what such a file computes for everyone who runs it, applies ggml_gelu, the
// tanh form, where those families' checkpoints use the exact (erf) one (about 1e-3 apart in
// the logits of the tiny fixtures).
constexpr const char* kLlamaCppGelu = "gelu_new";

int64_t config_int(const nlohmann::json& config, const char* key, int64_t fallback) {
  auto it = config.find(key);
  return it != config.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

// Gemma's query scale is not in the file: llama.cpp takes hidden / heads for the 27B models
// (told by their layer count) and the head width for every other size, as their configs'
// query_pre_attn_scalar say.
void gemma_query_scale(nlohmann::json* config, int64_t layers_of_27b) {
  const int64_t hidden = config_int(*config, "hidden_size", 0), heads = config_int(*config, "num_attention_heads", 1);
  const int64_t head_dim = config_int(*config, "head_dim", hidden / heads);
  (*config)["query_pre_attn_scalar"] = config_int(*config, "num_hidden_layers", 0) == layers_of_27b ? hidden / heads : head_dim;
}

// The sliding window every `period`-th layer lacks, as the file says it.
Status gemma_window(const GgufFile& file, const std::string& arch, int64_t default_period, const char* pattern_key,
                    nlohmann::json* config) {
  const std::string window_key = arch + ".attention.sliding_window";
  if (!file.has(window_key)) return Status::ok();  // the row's default window
  TESSERA_ASSIGN_OR_RETURN(int64_t window, file.get_int(window_key));
  (*config)["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
  const std::string period_key = arch + ".attention.sliding_window_pattern";
  if (!file.has(period_key)) return Status::ok();
  const GgufValue* v = file.find(period_key);
  if (v->type == GgufValueType::kArray) {
    return unimplemented(file.path() + ": a per-layer " + period_key + " is not supported");
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t period, file.get_int(period_key));
  if (pattern_key == nullptr) {
    if (period != default_period) {
      return unimplemented(file.path() + ": " + period_key + " " + std::to_string(period) + " is not supported (" +
                           arch + " slides on every " + std::to_string(default_period) + "nd layer)");
    }
    return Status::ok();
  }
  (*config)[pattern_key] = period;
  return Status::ok();
}

// Llama 3's rope scaling is stored as rope_freqs.weight: per rotary pair i, the divisor v_i
// of its frequency (1, `factor`, or 1 / ((1 - s) / factor + s) between, s = (original /
// wavelength - low) / (high - low)). s is linear in 1 / wavelength, so the pairs between
// give original / (high - low) and low / (high - low); with low = 1 (the released models')
// that is every parameter transformers' llama3 rope_scaling has. With fewer than two pairs
// between (small heads: 8 pairs of a head of 16 may have one or none), the factors do not
// determine the line, and any line giving the same factors computes the same frequencies:
// the one of high = 4 (the released models', and the converter's default) through the pair
// between, or between the last unscaled pair and the first scaled one. Whichever line is
// taken, it is checked against every v_i.
Status llama3_rope_from_factors(const GgufFile& file, const GgufTensor& t, nlohmann::json* config) {
  const std::string where = file.path() + ": " + t.name + " (Llama 3 rope scaling)";
  if (t.dims.size() != 1 || t.type != static_cast<uint32_t>(GgmlType::kF32)) {
    return invalid_argument(where + ": expected a 1-D f32 tensor");
  }
  const int64_t pairs = t.dims[0];
  std::vector<float> v(static_cast<size_t>(pairs));
  TESSERA_RETURN_IF_ERROR(dequantize_ggml(t.type, t.data, pairs, v.data()));
  const double theta = config->value("rope_theta", 10000.0);
  const double factor = *std::max_element(v.begin(), v.end());
  if (!(factor >= 1.0)) return invalid_argument(where + ": factors below 1 are not Llama 3's rule");
  if (factor == 1.0) return Status::ok();  // no scaling at all
  auto wavelength = [&](int64_t i) { return 2.0 * M_PI * std::pow(theta, 2.0 * static_cast<double>(i) / (2.0 * pairs)); };
  // s_i = a / wavelength_i + b on the pairs strictly between 1 and factor: a line fit.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  int64_t first_scaled = pairs;  // the first pair divided by the whole factor
  for (int64_t i = 0; i < pairs; ++i) {
    const double vi = v[static_cast<size_t>(i)];
    if (vi >= factor - 1e-6) first_scaled = std::min(first_scaled, i);
    if (vi <= 1.0 + 1e-6 || vi >= factor - 1e-6) continue;
    const double x = 1.0 / wavelength(i), y = (1.0 / vi - 1.0 / factor) / (1.0 - 1.0 / factor);
    sx += x, sy += y, sxx += x * x, sxy += x * y, ++n;
  }
  double span = 3.0, original = 0;  // high - low and the original context, with low = 1
  const double det = n * sxx - sx * sx;
  if (n >= 2 && det > 0) {
    const double a = (n * sxy - sx * sy) / det, b = (sy - a * sx) / n;
    if (!(b < 0) || !(a > 0)) return invalid_argument(where + ": the factors do not follow Llama 3's rule");
    span = -1.0 / b;
    original = a * span;
  } else if (n == 1) {
    original = (sy * span + 1.0) / sx;  // s = (original * x - 1) / span through the pair
  } else if (first_scaled > 0 && first_scaled < pairs) {
    // s >= 1 at the last unscaled pair and s <= 0 at the first scaled one.
    const double x_unscaled = 1.0 / wavelength(first_scaled - 1), x_scaled = 1.0 / wavelength(first_scaled);
    if ((1.0 + span) / x_unscaled > 1.0 / x_scaled) span = (x_unscaled / x_scaled - 1.0) / 2.0;
    original = std::sqrt((1.0 + span) / x_unscaled / x_scaled);
  } else {
    return unimplemented(where + ": every frequency divided by " + std::to_string(factor) +
                         " is not Llama 3's rule (no unscaled pair)");
  }
  for (int64_t i = 0; i < pairs; ++i) {
    const double s = std::clamp((original / wavelength(i) - 1.0) / span, 0.0, 1.0);
    const double expect = 1.0 / ((1.0 - s) / factor + s);
    if (std::fabs(expect - v[static_cast<size_t>(i)]) > 1e-3 * expect) {
      return invalid_argument(where + ": factor " + std::to_string(i) + " is " + std::to_string(v[static_cast<size_t>(i)]) +
                              " where Llama 3's rule gives " + std::to_string(expect));
    }
  }
  (*config)["rope_scaling"] = {{"rope_type", "llama3"},
                               {"factor", factor},
                               {"low_freq_factor", 1.0},
                               {"high_freq_factor", 1.0 + span},
                               {"original_max_position_embeddings", static_cast<int64_t>(std::llround(original))}};
  return Status::ok();
}

// Phi-3's LongRoPE: the converter stores the factors as rope_factors_long/short.weight (f32,
// one per rotated pair), the original context as rope.scaling.original_context_length and the
// attention factor it computed as rope.scaling.attn_factor; back into transformers' form.
Status phi3_longrope_from_factors(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                                  std::vector<std::string>* consumed) {
  const GgufTensor* long_t = file.find_tensor("rope_factors_long.weight");
  const GgufTensor* short_t = file.find_tensor("rope_factors_short.weight");
  const std::string where = file.path() + ": Phi-3 LongRoPE";
  if (long_t == nullptr || short_t == nullptr) {
    return invalid_argument(where + ": " + (long_t == nullptr ? "rope_factors_long.weight" : "rope_factors_short.weight") +
                            " is missing beside the other");
  }
  nlohmann::json rs = {{"rope_type", "longrope"}};
  for (const GgufTensor* t : {long_t, short_t}) {
    if (t->dims.size() != 1 || t->type != static_cast<uint32_t>(GgmlType::kF32)) {
      return invalid_argument(where + ": " + t->name + " must be a 1-D f32 tensor");
    }
    std::vector<float> v(static_cast<size_t>(t->dims[0]));
    TESSERA_RETURN_IF_ERROR(dequantize_ggml(t->type, t->data, t->dims[0], v.data()));
    rs[t == long_t ? "long_factor" : "short_factor"] = v;
    consumed->push_back(t->name);
  }
  const std::string original_key = arch + ".rope.scaling.original_context_length";
  if (!file.has(original_key)) return invalid_argument(where + ": missing key " + original_key);
  TESSERA_ASSIGN_OR_RETURN(int64_t original, file.get_int(original_key));
  (*config)["original_max_position_embeddings"] = original;
  const std::string attn_key = arch + ".rope.scaling.attn_factor";
  if (file.has(attn_key)) {
    TESSERA_ASSIGN_OR_RETURN(double attn, file.get_float(attn_key));
    rs["attention_factor"] = attn;
  }
  (*config)["rope_scaling"] = rs;
  return Status::ok();
}

}  // namespace

Status gguf_config_llama(const GgufFile& file, const std::string&, nlohmann::json* config,
                         std::vector<std::string>* consumed) {
  const GgufTensor* factors = file.find_tensor("rope_freqs.weight");
  if (factors == nullptr) return Status::ok();
  consumed->push_back(factors->name);
  return llama3_rope_from_factors(file, *factors, config);
}

Status gguf_config_phi3(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                        std::vector<std::string>* consumed) {
  if (file.find_tensor("rope_factors_long.weight") != nullptr || file.find_tensor("rope_factors_short.weight") != nullptr) {
    TESSERA_RETURN_IF_ERROR(phi3_longrope_from_factors(file, arch, config, consumed));
  }
  // Hugging Face's Phi-3 attends within its sliding window (llama.cpp's loader turns it off).
  const std::string window_key = arch + ".attention.sliding_window";
  if (file.has(window_key)) {
    TESSERA_ASSIGN_OR_RETURN(int64_t window, file.get_int(window_key));
    (*config)["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
  }
  return Status::ok();
}

Status gguf_config_gemma2(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                          std::vector<std::string>*) {
  TESSERA_RETURN_IF_ERROR(copy_key(file, arch + ".attn_logit_softcapping", "attn_logit_softcapping", config));
  TESSERA_RETURN_IF_ERROR(copy_key(file, arch + ".final_logit_softcapping", "final_logit_softcapping", config));
  TESSERA_RETURN_IF_ERROR(gemma_window(file, arch, 2, nullptr, config));
  gemma_query_scale(config, 46);
  return Status::ok();
}

Status gguf_config_gemma3(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                          std::vector<std::string>*) {
  if (file.has(arch + ".attn_logit_softcapping")) {
    return unimplemented(file.path() + ": " + arch + ".attn_logit_softcapping is not supported for gemma3");
  }
  TESSERA_RETURN_IF_ERROR(copy_key(file, arch + ".final_logit_softcapping", "final_logit_softcapping", config));
  TESSERA_RETURN_IF_ERROR(copy_key(file, arch + ".rope.freq_base_swa", "rope_local_base_freq", config));
  // No window key: llama.cpp attends to everything in every layer.
  if (!file.has(arch + ".attention.sliding_window")) (*config)["sliding_window"] = nullptr;
  TESSERA_RETURN_IF_ERROR(gemma_window(file, arch, 6, "sliding_window_pattern", config));
  gemma_query_scale(config, 62);
  return Status::ok();
}

// Falcon's layout is the tensors present: a second norm per block (attn_norm_2) is the new
// decoder architecture with ln_attn and ln_mlp (40B, 180B); otherwise one norm, with grouped
// KV heads (Falcon2-11B's new architecture) or one (7B's multi-query).
Status gguf_config_falcon(const GgufFile& file, const std::string&, nlohmann::json* config,
                          std::vector<std::string>*) {
  const bool two_norms = file.find_tensor("blk.0.attn_norm_2.weight") != nullptr;
  const int64_t kv = config_int(*config, "num_kv_heads", 1);
  const bool new_arch = two_norms || kv > 1;
  (*config)["new_decoder_architecture"] = new_arch;
  (*config)["multi_query"] = !new_arch;
  (*config)["parallel_attn"] = true;
  (*config)["num_ln_in_parallel_attn"] = new_arch ? nlohmann::json(two_norms ? 2 : 1) : nlohmann::json(nullptr);
  if (!new_arch) config->erase("num_kv_heads");
  (*config)["activation"] = kLlamaCppGelu;
  return Status::ok();
}

// Granite: Llama's keys (and rope_freqs) plus the four multipliers under llama.cpp's names.
// llama.cpp's loader takes an absent attention scale as 1 / sqrt(head width) (the converter
// writes none when the config has none, where transformers would take 1), the other absent
// ones as no scaling, and a rope.scaling.finetuned of false as no rotary at all.
Status gguf_config_granite(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                           std::vector<std::string>* consumed) {
  TESSERA_RETURN_IF_ERROR(gguf_config_llama(file, arch, config, consumed));
  const std::string finetuned_key = arch + ".rope.scaling.finetuned";
  if (file.has(finetuned_key)) {
    TESSERA_ASSIGN_OR_RETURN(bool finetuned, file.get_bool(finetuned_key));
    if (!finetuned) return unimplemented(file.path() + ": " + finetuned_key + " false (no rotary positions) is not supported");
  }
  const int64_t hidden = config_int(*config, "hidden_size", 0), heads = config_int(*config, "num_attention_heads", 1);
  const double plain_attention = 1.0 / std::sqrt(static_cast<double>(hidden / heads));
  for (const auto& [key, json_key, absent] : std::vector<std::tuple<std::string, std::string, double>>{
           {"embedding_scale", "embedding_multiplier", 1.0}, {"residual_scale", "residual_multiplier", 1.0},
           {"attention.scale", "attention_multiplier", plain_attention}, {"logit_scale", "logits_scaling", 1.0}}) {
    (*config)[json_key] = absent;  // not the row's config_extras (a generated model's values)
    TESSERA_RETURN_IF_ERROR(copy_key(file, arch + "." + key, json_key, config));
  }
  return Status::ok();
}

// MiniCPM: the converter writes embedding_scale = scale_emb, residual_scale = scale_depth /
// sqrt(layers) and logit_scale = hidden / dim_model_base; back into those config keys (a key
// absent: MiniCPM-2B's values, as llama.cpp's loader assumes them). LongRoPE factors as Phi-3's.
Status gguf_config_minicpm(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                           std::vector<std::string>* consumed) {
  TESSERA_RETURN_IF_ERROR(gguf_config_llama(file, arch, config, consumed));
  if (file.find_tensor("rope_factors_long.weight") != nullptr || file.find_tensor("rope_factors_short.weight") != nullptr) {
    TESSERA_RETURN_IF_ERROR(phi3_longrope_from_factors(file, arch, config, consumed));
  }
  const double layers = static_cast<double>(config_int(*config, "num_hidden_layers", 1));
  const double hidden = static_cast<double>(config_int(*config, "hidden_size", 1));
  auto read = [&](const std::string& key, double absent) -> StatusOr<double> {
    if (!file.has(arch + "." + key)) return absent;
    TESSERA_ASSIGN_OR_RETURN(double v, file.get_float(arch + "." + key));
    if (!(v > 0) || !std::isfinite(v)) return invalid_argument(file.path() + ": " + arch + "." + key + " must be a positive number");
    return v;
  };
  TESSERA_ASSIGN_OR_RETURN(double emb, read("embedding_scale", 12.0));
  TESSERA_ASSIGN_OR_RETURN(double residual, read("residual_scale", 1.4 / std::sqrt(layers)));
  TESSERA_ASSIGN_OR_RETURN(double logit, read("logit_scale", hidden / 256.0));
  (*config)["scale_emb"] = emb;
  (*config)["scale_depth"] = residual * std::sqrt(layers);
  (*config)["dim_model_base"] = hidden / logit;
  return Status::ok();
}

Status gguf_config_gpt_neox(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                            std::vector<std::string>*) {
  (*config)["hidden_act"] = kLlamaCppGelu;
  return copy_key(file, arch + ".use_parallel_residual", "use_parallel_residual", config);
}

}  // namespace tessera
