#pragma once
// A test-only converter from a Hugging Face folder (the tiny-<family> fixtures) to the GGUF
// file llama.cpp's convert_hf_to_gguf.py (commit d32676d77, conversion/<family>.py) writes for
// it, so that Tessera's GGUF reader is tested on every family without llama.cpp: the same
// general.architecture, the same `<arch>.*` metadata keys (only those that converter writes),
// the same tensor names and the same data transforms:
//   llama (Llama, Mistral, Mixtral): Q and K rows (weights and biases) interleaved per head;
//     experts stacked [experts, rows, in]; Llama 3 rope scaling as rope_freqs.weight; linear and
//     yarn rope scaling as rope.scaling.* keys.
//   granite: llama's, without head_dim, and the four multipliers as granite.* keys.
//   smollm3: llama's (the NoPE layers are not written: llama.cpp takes every fourth).
//   minicpm: the generic keys, scale_emb / scale_depth / dim_model_base as llama.cpp's
//     embedding, residual and logit scales, Q and K permuted as Llama's.
//   qwen2moe / qwen3moe: experts stacked; qwen2moe's shared expert and its gate.
//   gemma2 / gemma3: every *norm.weight stored as 1 + w (q/k norms too); gemma2 drops lm_head.
//   bloom, gptneox: the fused QKV, per head [q, k, v], regrouped to [Q; K; V] (bias too).
//   falcon: the fused QKV, per KV group [q..., k, v], regrouped to [Q; K; V].
//   gpt2: the Conv1D weights (c_attn, c_proj, c_fc) transposed to [out, in].
//   phi3: qkv_proj and gate_up_proj kept fused; LongRoPE's factors as rope_factors_long/short.
// What the file cannot say about the checkpoint (Mistral's sliding window, Gemma 2's
// query_pre_attn_scalar, ...) is listed in GgufConversion::lost, with the value llama.cpp's
// loader assumes instead, so a test can build the model the file describes.
// No tokenizer: the fixtures have none, so no tokenizer.ggml.* keys are written (the real
// converter would stop without a vocabulary; nothing else depends on it).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/dtype.h"
#include "common/gguf/gguf_file.h"
#include "common/status.h"
#include "tests/common/gguf_test_writer.h"
#include "tests/worker/gguf_hf_tensors.h"

namespace tessera::testing {

// The weights' storage type, as convert_hf_to_gguf.py --outtype says.
enum class GgufOutType {
  kF32,
  // q8_0 for the matrices (f16 where a row is not a whole number of 32-element blocks, as the
  // converter falls back); f32 for 1-D tensors, norms, routers and GPT-2's position table.
  kQ8_0,
  // The values of kQ8_0 decoded back to floats and stored f32: the twin a correct reader
  // must read to the very same numbers as the kQ8_0 file.
  kQ8_0AsF32,
};

// A setting of the checkpoint the GGUF file cannot carry.
struct GgufLostSetting {
  std::string key;              // config.json key
  nlohmann::json hf_value;      // what the checkpoint says
  nlohmann::json gguf_value;    // what a reader of the file must assume (llama.cpp's loader does)
  std::string reason;
};

struct GgufConversion {
  std::string arch;  // general.architecture
  GgufTestWriter writer;
  std::vector<GgufLostSetting> lost;
  // Where this file differs from what the converter at d32676d77 would do with the folder
  // (it would fail, and the file is what llama.cpp's loader expects of such a model).
  std::vector<std::string> notes;
};

namespace gguf_from_hf_detail {

class Converter {
 public:
  Converter(std::unique_ptr<Checkpoint> ckpt, GgufOutType type) : ckpt_(std::move(ckpt)), type_(type), hp_(ckpt_->config()) {}

  StatusOr<GgufConversion> run() {
    const std::string model_type = hp_.value("model_type", "");
    const std::string hf_arch = hp_.contains("architectures") ? hp_["architectures"][0].get<std::string>() : "";
    if (model_type == "llama" || model_type == "mistral" || model_type == "mixtral") {
      TESSERA_RETURN_IF_ERROR(llama("llama"));
    } else if (model_type == "granite") {
      TESSERA_RETURN_IF_ERROR(granite());
    } else if (model_type == "smollm3") {
      TESSERA_RETURN_IF_ERROR(smollm3());
    } else if (model_type == "minicpm") {
      TESSERA_RETURN_IF_ERROR(minicpm());
    } else if (model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen2_moe" || model_type == "qwen3_moe") {
      TESSERA_RETURN_IF_ERROR(qwen(model_type));
    } else if (model_type == "phi3") {
      TESSERA_RETURN_IF_ERROR(phi3());
    } else if (model_type == "gemma2" || model_type == "gemma3_text") {
      TESSERA_RETURN_IF_ERROR(gemma(model_type == "gemma2" ? "gemma2" : "gemma3"));
    } else if (model_type == "falcon") {
      TESSERA_RETURN_IF_ERROR(falcon());
    } else if (model_type == "gpt_neox") {
      TESSERA_RETURN_IF_ERROR(gpt_neox());
    } else if (model_type == "gpt2") {
      TESSERA_RETURN_IF_ERROR(gpt2());
    } else if (model_type == "starcoder2") {
      TESSERA_RETURN_IF_ERROR(starcoder2());
    } else if (model_type == "bloom") {
      TESSERA_RETURN_IF_ERROR(bloom());
    } else {
      return unimplemented(ckpt_->path() + ": no GGUF conversion for model_type '" + model_type + "' (" + hf_arch + ")");
    }
    // Every tensor of the checkpoint went somewhere (the converter raises "Can not map tensor").
    for (const std::string& name : ckpt_->tensor_names()) {
      if (done_.count(name) == 0) return invalid_argument(ckpt_->path() + ": Can not map tensor '" + name + "'");
    }
    kv("general.quantization_version", GgufValueType::kU32, gguf_le<uint32_t>(2));
    for (const Kv& e : kvs_) out_.writer.kv(e.key, e.type, e.value);
    return std::move(out_);
  }

 private:
  // ---- metadata ----
  bool has(const std::string& k) const { return hp_.contains(k) && !hp_[k].is_null(); }
  // The first of `keys` the config has (find_hparam); null when none.
  nlohmann::json find(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return hp_[k];
    return nullptr;
  }
  int64_t i(std::initializer_list<const char*> keys) const { return find(keys).get<int64_t>(); }
  // A metadata key; written again, it replaces the first value (GGUFWriter.add_key_value
  // warns and overwrites, as Gemma 3's overrides of the generic keys do).
  void kv(const std::string& key, GgufValueType type, std::string value) {
    for (Kv& e : kvs_) {
      if (e.key == key) {
        e.type = type;
        e.value = std::move(value);
        return;
      }
    }
    kvs_.push_back({key, type, std::move(value)});
  }
  void u32(const std::string& k, int64_t v) { kv(arch_ + "." + k, GgufValueType::kU32, gguf_le(static_cast<uint32_t>(v))); }
  void f32(const std::string& k, double v) { kv(arch_ + "." + k, GgufValueType::kF32, gguf_le(static_cast<float>(v))); }
  void str(const std::string& key, const std::string& v) { kv(key, GgufValueType::kString, gguf_str(v)); }
  void file_type_key() { kv("general.file_type", GgufValueType::kU32, gguf_le<uint32_t>(type_ == GgufOutType::kQ8_0 ? 7 : 0)); }
  void begin(const std::string& arch) {
    arch_ = arch;
    out_.arch = arch;
    str("general.architecture", arch);
    str("general.type", "model");
    str("general.name", ckpt_->config_dir().substr(ckpt_->config_dir().find_last_of('/') + 1));
  }
  void lose(const std::string& key, nlohmann::json gguf_value, const std::string& reason) {
    out_.lost.push_back({key, hp_.contains(key) ? hp_[key] : nlohmann::json(nullptr), std::move(gguf_value), reason});
  }

  // Falcon's and GPT-NeoX's MLP: llama.cpp's graph applies the tanh GELU whatever the
  // checkpoint's `key` names (the file carries no activation), so the model a file describes
  // has the tanh one where the folder has the exact one.
  void lose_exact_gelu(const std::string& key) {
    const std::string act = hp_.value(key, std::string("gelu"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      lose(key, "gelu_new", arch_ + ": llama.cpp computes the tanh GELU, not " + act);
  }

  // TextModel.set_gguf_parameters: the keys every family that calls it shares.
  void generic_keys() {
    u32("block_count", i({"n_layers", "num_hidden_layers", "n_layer", "num_layers"}));
    if (auto v = find({"max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                       "model_max_length"});
        !v.is_null())
      u32("context_length", v.get<int64_t>());
    if (auto v = find({"hidden_size", "n_embd", "dim"}); !v.is_null()) u32("embedding_length", v.get<int64_t>());
    if (auto v = find({"prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
                       "hidden_dim"});
        !v.is_null())
      u32("feed_forward_length", v.get<int64_t>());
    if (auto v = find({"num_attention_heads", "n_head", "n_heads"}); !v.is_null()) u32("attention.head_count", v.get<int64_t>());
    if (auto v = find({"num_key_value_heads", "n_kv_heads"}); !v.is_null()) u32("attention.head_count_kv", v.get<int64_t>());
    const nlohmann::json rope = has("rope_scaling") ? hp_["rope_scaling"] : nlohmann::json::object();
    const std::string rope_type = rope.value("rope_type", rope.value("type", ""));
    if (rope_type == "linear" && rope.contains("factor")) {
      str(arch_ + ".rope.scaling.type", "linear");
      f32("rope.scaling.factor", rope["factor"].get<double>());
    } else if (rope_type == "yarn" && rope.contains("factor")) {
      str(arch_ + ".rope.scaling.type", "yarn");
      f32("rope.scaling.factor", rope["factor"].get<double>());
      u32("rope.scaling.original_context_length", rope["original_max_position_embeddings"].get<int64_t>());
      for (const auto& [hf_key, key] : std::vector<std::pair<std::string, std::string>>{
               {"attention_factor", "yarn_attn_factor"}, {"beta_fast", "yarn_beta_fast"}, {"beta_slow", "yarn_beta_slow"}}) {
        if (rope.contains(hf_key)) f32("rope.scaling." + key, rope[hf_key].get<double>());
      }
    }  // llama3: rope_freqs.weight (llama()); longrope: phi3()
    if (auto v = find({"global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"});
        !v.is_null())
      f32("rope.freq_base", v.get<double>());
    if (auto v = find({"local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"});
        !v.is_null())
      f32("rope.freq_base_swa", v.get<double>());
    if (auto v = find({"rms_norm_eps", "norm_eps"}); !v.is_null()) f32("attention.layer_norm_rms_epsilon", v.get<double>());
    if (auto v = find({"layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"}); !v.is_null())
      f32("attention.layer_norm_epsilon", v.get<double>());
    if (auto v = find({"num_local_experts", "num_experts", "n_routed_experts"}); !v.is_null()) u32("expert_count", v.get<int64_t>());
    if (auto v = find({"num_experts_per_tok", "num_experts_per_token", "top_k_experts"}); !v.is_null())
      u32("expert_used_count", v.get<int64_t>());
    if (has("head_dim")) {
      u32("attention.key_length", hp_["head_dim"].get<int64_t>());
      u32("attention.value_length", hp_["head_dim"].get<int64_t>());
    }
    file_type_key();
  }

  // Mistral and StarCoder2 configs name a window the converter does not write: llama.cpp
  // attends to the whole context.
  void window_not_written() {
    if (has("sliding_window")) lose("sliding_window", nullptr, arch_ + ": the converter writes no sliding window");
  }

  // ---- tensors ----
  StatusOr<HfTensor> get(const std::string& name) {
    TESSERA_ASSIGN_OR_RETURN(Tensor t, ckpt_->load(name, DType::kF32));
    done_.insert(name);
    HfTensor out;
    for (int d = 0; d < t.ndim(); ++d) out.shape.push_back(t.dim(d));
    out.data.assign(t.data<float>(), t.data<float>() + t.numel());
    return out;
  }

  // Writes a tensor as the converter's prepare_tensors types it.
  void put(const std::string& gguf_name, const HfTensor& t) {
    std::vector<uint64_t> dims(t.shape.rbegin(), t.shape.rend());  // ggml lists the innermost first
    const bool force_f32 = t.shape.size() <= 1 || ends_with(gguf_name, "_norm.weight") ||
                           !ends_with(gguf_name, ".weight") || ends_with(gguf_name, "ffn_gate_inp.weight") ||
                           ends_with(gguf_name, "ffn_gate_inp_shexp.weight") || gguf_name == "position_embd.weight";
    auto f32_bytes = [](const std::vector<float>& v) {
      return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    };
    if (type_ == GgufOutType::kF32 || force_f32) {
      out_.writer.tensor(gguf_name, dims, GgmlType::kF32, f32_bytes(t.data));
      return;
    }
    const int64_t row = t.shape.back();
    std::string q;
    std::vector<float> decoded;
    GgmlType qtype;
    if (row % 32 == 0) {
      qtype = GgmlType::kQ8_0;
      for (size_t r = 0; r < t.data.size(); r += static_cast<size_t>(row)) q += ggml_q8_0_encode(&t.data[r], row);
      decoded = ggml_q8_0_decode(q);
    } else {  // the converter's fallback when a row is not whole blocks
      qtype = GgmlType::kF16;
      for (float x : t.data) {
        const uint16_t h = f32_to_f16(x);
        q.append(reinterpret_cast<const char*>(&h), 2);
        decoded.push_back(f16_to_f32(h));
      }
    }
    if (type_ == GgufOutType::kQ8_0AsF32) {
      out_.writer.tensor(gguf_name, dims, GgmlType::kF32, f32_bytes(decoded));
    } else {
      out_.writer.tensor(gguf_name, dims, qtype, q);
    }
  }

  // Maps every remaining checkpoint tensor: `global` names whole (without .weight/.bias),
  // `layer` names after "<layer_prefix>N."; each through `transform` (given the Hugging Face
  // name) before it is written. `skip` returns true for tensors the converter drops.
  template <typename Transform>
  Status map_all(const std::string& strip, const std::map<std::string, std::string>& global,
                 const std::string& layer_prefix, const std::map<std::string, std::string>& layer, Transform transform) {
    static const std::regex kLayered(R"(^(\d+)\.(.*)$)");
    for (const std::string& name : ckpt_->tensor_names()) {
      if (done_.count(name)) continue;
      if (ends_with(name, ".attention.masked_bias") || ends_with(name, ".attention.bias") ||
          ends_with(name, ".rotary_emb.inv_freq")) {
        done_.insert(name);
        continue;
      }
      std::string n = name;
      if (!strip.empty()) n = std::regex_replace(n, std::regex(strip), "");
      const bool bias = ends_with(n, ".bias"), weight = ends_with(n, ".weight");
      if (!bias && !weight) continue;  // unmapped: reported by run()
      const std::string suffix = bias ? ".bias" : ".weight";
      const std::string base = n.substr(0, n.size() - suffix.size());
      std::string gguf;
      if (auto g = global.find(base); g != global.end()) {
        gguf = g->second + suffix;
      } else if (base.rfind(layer_prefix, 0) == 0) {
        std::smatch m;
        const std::string rest = base.substr(layer_prefix.size());
        if (!std::regex_match(rest, m, kLayered)) continue;
        auto l = layer.find(m[2].str());
        if (l == layer.end()) continue;
        gguf = "blk." + m[1].str() + "." + l->second + suffix;
      } else {
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(HfTensor t, get(name));
      TESSERA_ASSIGN_OR_RETURN(t, transform(name, std::move(t)));
      put(gguf, t);
    }
    return Status::ok();
  }
  static StatusOr<HfTensor> as_is(const std::string&, HfTensor t) { return t; }

  // Routed experts, [E] tensors of [rows, in] per layer and kind, stacked to [E, rows, in].
  Status stack_experts(const std::string& pattern, const std::map<std::string, std::string>& kinds) {
    const int64_t layers = i({"num_hidden_layers"});
    const int64_t experts = i({"num_local_experts", "num_experts"});
    for (int64_t l = 0; l < layers; ++l) {
      for (const auto& [kind, gguf] : kinds) {
        HfTensor stacked;
        for (int64_t e = 0; e < experts; ++e) {
          std::string name = std::regex_replace(pattern, std::regex("\\{L\\}"), std::to_string(l));
          name = std::regex_replace(name, std::regex("\\{E\\}"), std::to_string(e));
          name = std::regex_replace(name, std::regex("\\{K\\}"), kind);
          if (ckpt_->find(name) == nullptr) break;  // a dense layer: its names stay unmapped
          TESSERA_ASSIGN_OR_RETURN(HfTensor t, get(name));
          if (stacked.shape.empty()) stacked.shape = {experts, t.shape[0], t.shape[1]};
          stacked.data.insert(stacked.data.end(), t.data.begin(), t.data.end());
        }
        if (!stacked.shape.empty()) put("blk." + std::to_string(l) + "." + gguf, stacked);
      }
    }
    return Status::ok();
  }

  // ---- families ----
  static std::map<std::string, std::string> llama_layer_names() {
    return {{"input_layernorm", "attn_norm"},         {"self_attn.q_proj", "attn_q"},
            {"self_attn.k_proj", "attn_k"},           {"self_attn.v_proj", "attn_v"},
            {"self_attn.o_proj", "attn_output"},      {"post_attention_layernorm", "ffn_norm"},
            {"mlp.gate_proj", "ffn_gate"},            {"mlp.up_proj", "ffn_up"},
            {"mlp.down_proj", "ffn_down"}};
  }
  static std::map<std::string, std::string> llama_global_names() {
    return {{"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"}};
  }

  Status llama(const std::string& arch) {
    begin(arch);
    generic_keys();
    u32("vocab_size", i({"vocab_size"}));
    const int64_t heads = i({"num_attention_heads"});
    u32("rope.dimension_count", has("head_dim") ? i({"head_dim"}) : i({"hidden_size"}) / heads);
    window_not_written();
    // Llama 3 rope scaling: rope_freqs.weight, a divisor per rotary pair (generate_extra_tensors).
    const nlohmann::json rope = has("rope_scaling") ? hp_["rope_scaling"] : nlohmann::json::object();
    if (rope.value("rope_type", rope.value("type", "")) == "llama3") {
      const double base = hp_.value("rope_theta", 10000.0);
      const int64_t dim = has("head_dim") ? i({"head_dim"}) : i({"hidden_size"}) / heads;
      const double factor = rope.value("factor", 8.0), low = rope.value("low_freq_factor", 1.0),
                   high = rope.value("high_freq_factor", 4.0);
      const double original = rope.value("original_max_position_embeddings", 8192.0);
      HfTensor f{{dim / 2}, {}};
      for (int64_t k = 0; k < dim; k += 2) {
        const float freq = 1.0f / std::pow(static_cast<float>(base), static_cast<float>(k) / static_cast<float>(dim));
        const double wavelen = 2 * M_PI / freq;
        double v;
        if (wavelen < original / high) {
          v = 1;
        } else if (wavelen > original / low) {
          v = factor;
        } else {
          const double smooth = (original / wavelen - low) / (high - low);
          v = 1 / ((1 - smooth) / factor + smooth);
        }
        f.data.push_back(static_cast<float>(v));
      }
      put("rope_freqs.weight", f);
    }
    if (has("num_local_experts")) {
      TESSERA_RETURN_IF_ERROR(stack_experts("model.layers.{L}.block_sparse_moe.experts.{E}.{K}.weight",
                                            {{"w1", "ffn_gate_exps.weight"},
                                             {"w2", "ffn_down_exps.weight"},
                                             {"w3", "ffn_up_exps.weight"}}));
    }
    std::map<std::string, std::string> layer = llama_layer_names();
    layer["block_sparse_moe.gate"] = "ffn_gate_inp";
    return map_llama_tensors(layer);
  }

  // Llama's tensor names, Q and K (weights and biases) permuted as LlamaModel.modify_tensors.
  Status map_llama_tensors(const std::map<std::string, std::string>& layer) {
    const int64_t heads = i({"num_attention_heads"});
    const int64_t kv = has("num_key_value_heads") ? i({"num_key_value_heads"}) : heads;
    return map_all("", llama_global_names(), "model.layers.", layer,
                   [&](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
                     if (ends_with(name, "q_proj.weight") || ends_with(name, "q_proj.bias")) return llama_permute(t, heads);
                     if (ends_with(name, "k_proj.weight") || ends_with(name, "k_proj.bias")) return llama_permute(t, kv);
                     return t;
                   });
  }

  // GraniteModel (conversion/granite.py): the Llama converter without head_dim, then each
  // multiplier the config gives (and is not 0) under llama.cpp's name.
  Status granite() {
    hp_.erase("head_dim");
    TESSERA_RETURN_IF_ERROR(llama("granite"));
    for (const auto& [hf_key, key] : std::vector<std::pair<std::string, std::string>>{
             {"attention_multiplier", "attention.scale"}, {"embedding_multiplier", "embedding_scale"},
             {"residual_multiplier", "residual_scale"}, {"logits_scaling", "logit_scale"}}) {
      if (has(hf_key) && hp_[hf_key].get<double>() != 0) f32(key, hp_[hf_key].get<double>());
    }
    if (!has("attention_multiplier") || hp_["attention_multiplier"].get<double>() == 0) {
      const double head_dim = static_cast<double>(i({"hidden_size"}) / i({"num_attention_heads"}));
      lose("attention_multiplier", 1.0 / std::sqrt(head_dim),
           "granite: the converter writes no attention.scale (llama.cpp takes 1/sqrt(head width), transformers 1)");
    }
    return Status::ok();
  }

  // MiniCPMModel (conversion/minicpm.py): TextModel's keys, the three scalings as llama.cpp's
  // embedding / residual / logit scales, Q and K permuted as Llama's.
  Status minicpm() {
    begin("minicpm");
    generic_keys();
    f32("embedding_scale", hp_["scale_emb"].get<double>());
    f32("residual_scale", hp_["scale_depth"].get<double>() / std::sqrt(static_cast<double>(i({"num_hidden_layers"}))));
    f32("logit_scale", static_cast<double>(i({"hidden_size"})) / hp_["dim_model_base"].get<double>());
    return map_llama_tensors(llama_layer_names());
  }

  // SmolLM3Model: the Llama converter as it is. llama.cpp's loader takes every fourth layer
  // as NoPE (3, 7, ...) and no sliding window, whatever the config says.
  Status smollm3() {
    TESSERA_RETURN_IF_ERROR(llama("smollm3"));
    const int64_t layers = i({"num_hidden_layers"});
    const int64_t interval = has("no_rope_layer_interval") ? i({"no_rope_layer_interval"}) : 4;
    std::vector<int64_t> hf, gguf;
    for (int64_t l = 0; l < layers; ++l) {
      hf.push_back(has("no_rope_layers") ? hp_["no_rope_layers"][l].get<int64_t>() : (l + 1) % interval != 0);
      gguf.push_back((l + 1) % 4 != 0);
    }
    if (hf != gguf) lose("no_rope_layers", gguf, "smollm3: llama.cpp's loader takes every fourth layer as NoPE");
    if (hp_.value("use_sliding_window", false)) lose("use_sliding_window", false, "smollm3: the converter writes no window");
    return Status::ok();
  }

  Status qwen(const std::string& model_type) {
    const bool moe = model_type == "qwen2_moe" || model_type == "qwen3_moe";
    begin(model_type == "qwen2" ? "qwen2" : model_type == "qwen3" ? "qwen3" : model_type == "qwen2_moe" ? "qwen2moe" : "qwen3moe");
    generic_keys();
    if (moe) {
      if (has("moe_intermediate_size")) u32("expert_feed_forward_length", i({"moe_intermediate_size"}));
      if (has("shared_expert_intermediate_size"))
        u32("expert_shared_feed_forward_length", i({"shared_expert_intermediate_size"}));
      TESSERA_RETURN_IF_ERROR(stack_experts("model.layers.{L}.mlp.experts.{E}.{K}.weight",
                                            {{"down_proj", "ffn_down_exps.weight"},
                                             {"gate_proj", "ffn_gate_exps.weight"},
                                             {"up_proj", "ffn_up_exps.weight"}}));
    }
    if (has("use_sliding_window") && hp_["use_sliding_window"].get<bool>()) {
      lose("use_sliding_window", false, arch_ + ": the converter writes no sliding window");
    }
    std::map<std::string, std::string> layer = llama_layer_names();
    if (model_type == "qwen3" || model_type == "qwen3_moe") {
      layer["self_attn.q_norm"] = "attn_q_norm";
      layer["self_attn.k_norm"] = "attn_k_norm";
    }
    if (moe) {
      // MODEL_TENSORS[qwen2moe/qwen3moe] has no dense FFN: a layer of mlp_only_layers cannot be named.
      for (const char* dense : {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) layer.erase(dense);
      layer["mlp.gate"] = "ffn_gate_inp";
      if (model_type == "qwen2_moe") {
        layer["mlp.shared_expert.gate_proj"] = "ffn_gate_shexp";
        layer["mlp.shared_expert.up_proj"] = "ffn_up_shexp";
        layer["mlp.shared_expert.down_proj"] = "ffn_down_shexp";
        layer["mlp.shared_expert_gate"] = "ffn_gate_inp_shexp";
      }
    }
    return map_all("", llama_global_names(), "model.layers.", layer, as_is);
  }

  Status phi3() {
    begin("phi3");
    const int64_t hidden = i({"hidden_size", "n_embd"}), heads = i({"num_attention_heads", "n_head"});
    const double rot = hp_.value("partial_rotary_factor", 1.0);
    u32("context_length", i({"n_positions", "max_position_embeddings"}));
    u32("rope.scaling.original_context_length", i({"original_max_position_embeddings"}));
    u32("embedding_length", hidden);
    u32("feed_forward_length", i({"intermediate_size"}));
    u32("block_count", i({"num_hidden_layers"}));
    u32("attention.head_count", heads);
    u32("attention.head_count_kv", i({"num_key_value_heads", "n_head_kv"}));
    f32("attention.layer_norm_rms_epsilon", hp_["rms_norm_eps"].get<double>());
    u32("rope.dimension_count", static_cast<int64_t>(rot * static_cast<double>(hidden)) / heads);
    f32("rope.freq_base", hp_["rope_theta"].get<double>());
    file_type_key();
    u32("attention.sliding_window", has("sliding_window") ? i({"sliding_window"}) : 0);
    if (has("rope_scaling") && hp_["rope_scaling"].contains("long_factor")) {
      // generate_extra_tensors: the factors as f32 tensors and the attention factor it
      // computes (never the config's own attention_factor).
      const nlohmann::json& rs = hp_["rope_scaling"];
      const double scale = static_cast<double>(i({"max_position_embeddings"})) /
                           static_cast<double>(i({"original_max_position_embeddings"}));
      const double original = static_cast<double>(i({"original_max_position_embeddings"}));
      f32("rope.scaling.attn_factor", scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(original)) : 1.0);
      for (const char* which : {"long", "short"}) {
        HfTensor t;
        t.data = rs[std::string(which) + "_factor"].get<std::vector<float>>();
        t.shape = {static_cast<int64_t>(t.data.size())};
        put(std::string("rope_factors_") + which + ".weight", t);
      }
    }
    std::map<std::string, std::string> layer = llama_layer_names();
    layer["self_attn.qkv_proj"] = "attn_qkv";
    layer["mlp.gate_up_proj"] = "ffn_up";
    return map_all("", llama_global_names(), "model.layers.", layer, as_is);
  }

  Status gemma(const std::string& arch) {
    begin(arch);
    const int64_t heads = i({"num_attention_heads"}), head_dim = i({"head_dim"});
    const int64_t layers = i({"num_hidden_layers"});
    if (arch == "gemma2") {
      u32("context_length", i({"max_position_embeddings"}));
      u32("embedding_length", i({"hidden_size"}));
      u32("block_count", layers);
      u32("feed_forward_length", i({"intermediate_size"}));
      u32("attention.head_count", heads);
      u32("attention.head_count_kv", has("num_key_value_heads") ? i({"num_key_value_heads"}) : heads);
      f32("attention.layer_norm_rms_epsilon", hp_["rms_norm_eps"].get<double>());
      u32("attention.key_length", head_dim);
      u32("attention.value_length", head_dim);
      file_type_key();
      f32("attn_logit_softcapping", hp_["attn_logit_softcapping"].get<double>());
      f32("final_logit_softcapping", hp_["final_logit_softcapping"].get<double>());
      u32("attention.sliding_window", i({"sliding_window"}));
      // No rope.freq_base: llama.cpp takes 10000 (Gemma 2's), whatever the config says.
      if (hp_.value("rope_theta", 10000.0) != 10000.0)
        lose("rope_theta", 10000.0, "gemma2: the converter writes no rope.freq_base (llama.cpp assumes 10000)");
    } else {
      generic_keys();
      u32("context_length", hp_.value("max_position_embeddings", 131072));
      u32("attention.head_count", hp_.value("num_attention_heads", 8));
      f32("attention.layer_norm_rms_epsilon", hp_.value("rms_norm_eps", 1e-6));
      u32("attention.key_length", hp_.value("head_dim", 256));
      u32("attention.value_length", hp_.value("head_dim", 256));
      f32("rope.freq_base", hp_.value("rope_theta", 1e6));
      if (has("final_logit_softcapping") && hp_["final_logit_softcapping"].get<double>() != 0)
        f32("final_logit_softcapping", hp_["final_logit_softcapping"].get<double>());
      if (hp_.value("sliding_window_pattern", 0) != 1) u32("attention.sliding_window", i({"sliding_window"}));
      u32("attention.head_count_kv", hp_.value("num_key_value_heads", 4));
      if (has("sliding_window_pattern") && hp_["sliding_window_pattern"].get<int64_t>() != 6) {
        lose("sliding_window_pattern", 6, "gemma3: the converter writes no window pattern (llama.cpp assumes 6)");
      }
    }
    // query_pre_attn_scalar is not in the file: llama.cpp takes hidden / heads for the 27B
    // models (46 layers for Gemma 2, 62 for Gemma 3) and head_dim otherwise.
    const int64_t scalar = layers == (arch == "gemma2" ? 46 : 62) ? i({"hidden_size"}) / heads : head_dim;
    if (has("query_pre_attn_scalar") && hp_["query_pre_attn_scalar"].get<double>() != static_cast<double>(scalar)) {
      lose("query_pre_attn_scalar", scalar, arch + ": not stored; llama.cpp scales queries by head_dim (1/sqrt(" +
                                               std::to_string(scalar) + "))");
    }
    std::map<std::string, std::string> layer = llama_layer_names();
    layer["post_attention_layernorm"] = "post_attention_norm";
    layer["pre_feedforward_layernorm"] = "ffn_norm";
    layer["post_feedforward_layernorm"] = "post_ffw_norm";
    layer["self_attn.q_norm"] = "attn_q_norm";
    layer["self_attn.k_norm"] = "attn_k_norm";
    std::map<std::string, std::string> global = llama_global_names();
    if (arch == "gemma2") {
      global.erase("lm_head");
      if (ckpt_->find("lm_head.weight") != nullptr) done_.insert("lm_head.weight");  // filter_tensors drops it
    }
    // gemma3 trims embed_tokens to the tokenizer's size; the fixtures have no tokenizer.
    return map_all("", global, "model.layers.", layer, [](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
      if (ends_with(name, "norm.weight"))
        for (float& x : t.data) x += 1.0f;
      return t;
    });
  }

  Status falcon() {
    begin("falcon");
    const int64_t heads = i({"num_attention_heads", "n_head"}), hidden = i({"hidden_size"});
    // set_gguf_parameters reads num_kv_heads whatever the layout; a multi-query (Falcon-7B
    // layout) config that states num_kv_heads, as save_pretrained writes it, would then
    // fail in modify_tensors' view(). Files of that layout carry head_count_kv 1.
    const bool new_arch = hp_.value("new_decoder_architecture", false);
    const int64_t kv = new_arch ? i({"num_kv_heads", "n_head_kv"}) : (hp_.value("multi_query", true) ? 1 : heads);
    if (!new_arch && has("num_kv_heads") && i({"num_kv_heads"}) != kv) {
      out_.notes.push_back("falcon: head_count_kv " + std::to_string(kv) + ", not num_kv_heads " +
                           std::to_string(i({"num_kv_heads"})) +
                           " (the converter reads num_kv_heads whatever the layout and would fail to view this "
                           "checkpoint's fused QKV; Falcon-7B files carry head_count_kv 1)");
    }
    u32("context_length", 2048);
    str(arch_ + ".tensor_data_layout", "jploski");
    u32("embedding_length", hidden);
    u32("feed_forward_length", 4 * hidden);
    u32("block_count", i({"num_hidden_layers", "n_layer"}));
    u32("attention.head_count", heads);
    u32("attention.head_count_kv", kv);
    f32("attention.layer_norm_epsilon", hp_["layer_norm_epsilon"].get<double>());
    file_type_key();
    if (has("ffn_hidden_size") && i({"ffn_hidden_size"}) != 4 * hidden) {
      lose("ffn_hidden_size", 4 * hidden, "falcon: the converter writes feed_forward_length = 4 * hidden_size");
    }
    lose_exact_gelu("activation");
    const int64_t head_dim = hidden / heads;
    return map_all("", {{"transformer.word_embeddings", "token_embd"}, {"transformer.ln_f", "output_norm"}, {"lm_head", "output"}},
                   "transformer.h.",
                   {{"input_layernorm", "attn_norm"},
                    {"ln_mlp", "attn_norm"},
                    {"ln_attn", "attn_norm_2"},
                    {"self_attention.query_key_value", "attn_qkv"},
                    {"self_attention.dense", "attn_output"},
                    {"mlp.dense_h_to_4h", "ffn_up"},
                    {"mlp.dense_4h_to_h", "ffn_down"}},
                   [&](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
                     if (name.find("query_key_value") == std::string::npos) return t;
                     return qkv_groups_to_blocks(t, kv, heads / kv, head_dim);
                   });
  }

  Status gpt_neox() {
    begin("gptneox");
    const int64_t hidden = i({"hidden_size"}), heads = i({"num_attention_heads"});
    u32("context_length", i({"max_position_embeddings"}));
    u32("embedding_length", hidden);
    u32("block_count", i({"num_hidden_layers"}));
    u32("feed_forward_length", i({"intermediate_size"}));
    u32("rope.dimension_count", static_cast<int64_t>(hp_["rotary_pct"].get<double>() * static_cast<double>(hidden / heads)));
    u32("attention.head_count", heads);
    kv(arch_ + ".use_parallel_residual", GgufValueType::kBool, gguf_le<uint8_t>(hp_.value("use_parallel_residual", true) ? 1 : 0));
    f32("attention.layer_norm_epsilon", hp_["layer_norm_eps"].get<double>());
    // No general.file_type, no rope.freq_base: llama.cpp assumes 10000.
    const double base = hp_.value("rotary_emb_base", hp_.value("rope_theta", 10000.0));
    if (base != 10000.0) lose("rotary_emb_base", 10000.0, "gptneox: the converter writes no rope.freq_base (llama.cpp assumes 10000)");
    lose_exact_gelu("hidden_act");
    return map_all("", {{"gpt_neox.embed_in", "token_embd"}, {"gpt_neox.final_layer_norm", "output_norm"}, {"embed_out", "output"}},
                   "gpt_neox.layers.",
                   {{"input_layernorm", "attn_norm"},
                    {"attention.query_key_value", "attn_qkv"},
                    {"attention.dense", "attn_output"},
                    {"post_attention_layernorm", "ffn_norm"},
                    {"mlp.dense_h_to_4h", "ffn_up"},
                    {"mlp.dense_4h_to_h", "ffn_down"}},
                   [&](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
                     if (name.find("query_key_value") == std::string::npos) return t;
                     return qkv_groups_to_blocks(t, heads, 1, hidden / heads);
                   });
  }

  Status gpt2() {
    begin("gpt2");
    const int64_t hidden = i({"n_embd"});
    u32("block_count", i({"n_layer"}));
    u32("context_length", i({"n_ctx"}));
    u32("embedding_length", hidden);
    u32("feed_forward_length", 4 * hidden);
    u32("attention.head_count", i({"n_head"}));
    f32("attention.layer_norm_epsilon", hp_["layer_norm_epsilon"].get<double>());
    file_type_key();
    if (has("n_inner") && i({"n_inner"}) != 4 * hidden) {
      lose("n_inner", 4 * hidden, "gpt2: the converter writes feed_forward_length = 4 * n_embd");
    }
    std::map<std::string, std::string> global = {{"wte", "token_embd"}, {"wpe", "position_embd"}, {"ln_f", "output_norm"},
                                                 {"lm_head", "output"}};
    for (const char* g : {"wte", "wpe", "ln_f"}) global[std::string("transformer.") + g] = global[g];
    std::map<std::string, std::string> layer = {{"ln_1", "attn_norm"},    {"attn.c_attn", "attn_qkv"},
                                                {"attn.c_proj", "attn_output"}, {"ln_2", "ffn_norm"},
                                                {"mlp.c_fc", "ffn_up"},    {"mlp.c_proj", "ffn_down"}};
    Status st = map_all("", global, "transformer.h.", layer, [](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
      if (ends_with(name, ".c_attn.weight") || ends_with(name, ".c_proj.weight") || ends_with(name, ".c_fc.weight"))
        return transpose2d(t);
      return t;
    });
    TESSERA_RETURN_IF_ERROR(st);
    return map_all("", global, "h.", layer, [](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
      if (ends_with(name, ".c_attn.weight") || ends_with(name, ".c_proj.weight") || ends_with(name, ".c_fc.weight"))
        return transpose2d(t);
      return t;
    });
  }

  Status starcoder2() {
    begin("starcoder2");
    generic_keys();
    window_not_written();
    std::map<std::string, std::string> layer = llama_layer_names();
    layer["mlp.c_fc"] = "ffn_up";
    layer["mlp.c_proj"] = "ffn_down";
    return map_all("", llama_global_names(), "model.layers.", layer, as_is);
  }

  Status bloom() {
    begin("bloom");
    const int64_t hidden = i({"hidden_size", "n_embed"}), heads = i({"n_head", "num_attention_heads"});
    u32("context_length", hp_.value("seq_length", hidden));
    u32("embedding_length", hidden);
    u32("feed_forward_length", 4 * hidden);
    u32("block_count", i({"n_layer", "num_hidden_layers"}));
    u32("attention.head_count", heads);
    u32("attention.head_count_kv", heads);
    f32("attention.layer_norm_epsilon", hp_["layer_norm_epsilon"].get<double>());
    file_type_key();
    return map_all("^transformer\\.",
                   {{"word_embeddings", "token_embd"},
                    {"word_embeddings_layernorm", "token_embd_norm"},
                    {"ln_f", "output_norm"},
                    {"lm_head", "output"}},
                   "h.",
                   {{"input_layernorm", "attn_norm"},
                    {"self_attention.query_key_value", "attn_qkv"},
                    {"self_attention.dense", "attn_output"},
                    {"post_attention_layernorm", "ffn_norm"},
                    {"mlp.dense_h_to_4h", "ffn_up"},
                    {"mlp.dense_4h_to_h", "ffn_down"}},
                   [&](const std::string& name, HfTensor t) -> StatusOr<HfTensor> {
                     if (name.find("query_key_value") == std::string::npos) return t;
                     return qkv_groups_to_blocks(t, heads, 1, hidden / heads);
                   });
  }

  struct Kv {
    std::string key;
    GgufValueType type;
    std::string value;
  };

  std::unique_ptr<Checkpoint> ckpt_;
  GgufOutType type_;
  std::vector<Kv> kvs_;
  nlohmann::json hp_;  // a copy: a family converter may drop keys, as the real ones pop them
  std::string arch_;
  GgufConversion out_;
  std::set<std::string> done_;  // checkpoint tensors written (or dropped as the converter drops them)
};

}  // namespace gguf_from_hf_detail

// The GGUF file convert_hf_to_gguf.py would write for the Hugging Face folder `hf_dir`. A
// checkpoint it cannot convert is an error naming the tensor or setting, as the converter's.
inline StatusOr<GgufConversion> gguf_from_hf(const std::string& hf_dir, GgufOutType type = GgufOutType::kF32) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(hf_dir));
  return gguf_from_hf_detail::Converter(std::move(ckpt), type).run();
}

}  // namespace tessera::testing
