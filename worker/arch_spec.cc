#include "worker/arch_spec.h"

#include <algorithm>
#include <cmath>

#include "common/string_util.h"
#include "worker/arch_gguf.h"
#include "worker/config_fields.h"
#include "worker/model_config.h"

namespace tessera {
namespace {

namespace cf = config_fields;
using R = TensorRole;

void set(ArchSpec& s, R role, std::string name) { s.names[static_cast<size_t>(role)] = std::move(name); }
void set_gguf(ArchSpec& s, R role, std::string name) { s.gguf_names[static_cast<size_t>(role)] = std::move(name); }

// llama.cpp's tensor names (gguf-py's constants.py), the same for every family: a role has
// one GGUF name wherever the family has that role.
void standard_gguf_names(ArchSpec& s) {
  set_gguf(s, R::kEmbed, "token_embd.weight");
  set_gguf(s, R::kPosEmbed, "position_embd.weight");
  set_gguf(s, R::kEmbedNorm, "token_embd_norm.weight");
  set_gguf(s, R::kFinalNorm, "output_norm.weight");
  set_gguf(s, R::kLmHead, "output.weight");
  set_gguf(s, R::kAttnNorm, "blk.{L}.attn_norm.weight");
  set_gguf(s, R::kQ, "blk.{L}.attn_q.weight");
  set_gguf(s, R::kK, "blk.{L}.attn_k.weight");
  set_gguf(s, R::kV, "blk.{L}.attn_v.weight");
  set_gguf(s, R::kQkv, "blk.{L}.attn_qkv.weight");
  set_gguf(s, R::kQNorm, "blk.{L}.attn_q_norm.weight");
  set_gguf(s, R::kKNorm, "blk.{L}.attn_k_norm.weight");
  set_gguf(s, R::kO, "blk.{L}.attn_output.weight");
  set_gguf(s, R::kPostAttnNorm, "blk.{L}.post_attention_norm.weight");
  set_gguf(s, R::kMlpNorm, "blk.{L}.ffn_norm.weight");
  set_gguf(s, R::kGate, "blk.{L}.ffn_gate.weight");
  set_gguf(s, R::kUp, "blk.{L}.ffn_up.weight");
  set_gguf(s, R::kGateUp, "blk.{L}.ffn_up.weight");  // Phi-3 keeps gate|up fused in ffn_up
  set_gguf(s, R::kDown, "blk.{L}.ffn_down.weight");
  set_gguf(s, R::kPostMlpNorm, "blk.{L}.post_ffw_norm.weight");
  set_gguf(s, R::kRouter, "blk.{L}.ffn_gate_inp.weight");
  set_gguf(s, R::kExpertGate, "blk.{L}.ffn_gate_exps.weight");
  set_gguf(s, R::kExpertUp, "blk.{L}.ffn_up_exps.weight");
  set_gguf(s, R::kExpertDown, "blk.{L}.ffn_down_exps.weight");
  set_gguf(s, R::kSharedGate, "blk.{L}.ffn_gate_shexp.weight");
  set_gguf(s, R::kSharedUp, "blk.{L}.ffn_up_shexp.weight");
  set_gguf(s, R::kSharedDown, "blk.{L}.ffn_down_shexp.weight");
  set_gguf(s, R::kSharedExpertGate, "blk.{L}.ffn_gate_inp_shexp.weight");
}

// ---- Family-specific config.json fields --------------------------------------------------

Status adapt_bloom(const nlohmann::json& config, const std::string& source, ModelConfig*) {
  bool post_ln_residual = false;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"apply_residual_connection_post_layernorm"}, &post_ln_residual));
  if (post_ln_residual) {
    return unimplemented(source + ": apply_residual_connection_post_layernorm=true is not supported");
  }
  return Status::ok();
}

// Falcon's three QKV layouts and two residual wirings are chosen by config flags, as in
// transformers' FalconAttention / FalconDecoderLayer.
Status adapt_falcon(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  bool alibi = false;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"alibi"}, &alibi));
  if (alibi) return unimplemented(source + ": \"alibi\": true (Falcon-RW's ALiBi attention) is not supported");
  // The old "RefinedWeb" configs (Falcon-40B's first release) are the new architecture.
  bool new_arch = c->model_type == "RefinedWeb";
  bool multi_query = true, parallel = true;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"new_decoder_architecture"}, &new_arch));
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"multi_query"}, &multi_query));
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"parallel_attn"}, &parallel));
  if (new_arch) {
    int64_t kv = c->heads, norms = 2;
    TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"num_kv_heads", "n_head_kv"}, false, &kv));
    TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"num_ln_in_parallel_attn"}, false, &norms));
    if (c->heads % kv != 0) {
      return invalid_argument(source + ": num_attention_heads " + std::to_string(c->heads) +
                              " is not a multiple of num_kv_heads " + std::to_string(kv));
    }
    if (norms != 1 && norms != 2) {
      return invalid_argument(source + ": \"num_ln_in_parallel_attn\" must be 1 or 2, got " + std::to_string(norms));
    }
    if (norms == 1 && !parallel) {
      return unimplemented(source + ": new_decoder_architecture with num_ln_in_parallel_attn 1 and "
                                    "parallel_attn false is not supported");
    }
    c->kv_heads = kv;
    c->qkv = QkvLayout::kGrouped;
    c->block = BlockKind::kParallel;  // the new architecture is always parallel
    c->mlp_norm = norms == 2;
  } else {
    // num_kv_heads is written by save_pretrained but not read by this architecture.
    c->kv_heads = multi_query ? 1 : c->heads;
    c->qkv = multi_query ? QkvLayout::kConcat : QkvLayout::kGrouped;
    c->block = parallel ? BlockKind::kParallel : BlockKind::kSequential;
    c->mlp_norm = !parallel;
  }
  return Status::ok();
}

Status adapt_gpt_neox(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  bool parallel = true;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"use_parallel_residual"}, &parallel));
  c->block = parallel ? BlockKind::kParallel : BlockKind::kSequential;
  return Status::ok();
}

Status adapt_gpt2(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  bool scaled = true, by_layer = false, cross = false;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"scale_attn_weights"}, &scaled));
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"scale_attn_by_inverse_layer_idx"}, &by_layer));
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"add_cross_attention"}, &cross));
  if (cross) return unimplemented(source + ": \"add_cross_attention\": true (an encoder-decoder GPT-2) is not supported");
  for (int l = 0; l < c->layers; ++l) {
    float s = scaled ? 1.0f / std::sqrt(static_cast<float>(c->head_dim)) : 1.0f;
    if (by_layer) s /= static_cast<float>(l + 1);
    c->layer[l].attn_scale = s;
  }
  return Status::ok();
}

// Gemma 2 and 3 share these fields; absent keys take the configuration classes' defaults.
Status adapt_gemma_common(const nlohmann::json& config, const std::string& source, ModelConfig* c,
                          float default_attn_cap, float default_final_cap) {
  float scalar = 256.0f;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"query_pre_attn_scalar"}, &scalar));
  for (LayerSpec& l : c->layer) l.attn_scale = 1.0f / std::sqrt(scalar);
  // A key present as null switches the cap off; an absent key keeps the class default.
  auto cap = [&](const char* key, float dflt, float* out) -> Status {
    *out = dflt;
    auto it = config.find(key);
    if (it == config.end()) return Status::ok();
    if (it->is_null()) {
      *out = 0.0f;
      return Status::ok();
    }
    return cf::read_positive_float(config, source, {key}, out);
  };
  TESSERA_RETURN_IF_ERROR(cap("attn_logit_softcapping", default_attn_cap, &c->attn_softcap));
  TESSERA_RETURN_IF_ERROR(cap("final_logit_softcapping", default_final_cap, &c->final_softcap));
  // Scaled in the model's dtype by the transformer (transformers: torch.tensor(sqrt(h), dtype)).
  c->embed_scale = std::sqrt(static_cast<float>(c->hidden));
  c->embed_scale_in_dtype = true;
  return Status::ok();
}

Status adapt_gemma2(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  return adapt_gemma_common(config, source, c, 50.0f, 30.0f);
}

Status adapt_gemma3(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  TESSERA_RETURN_IF_ERROR(adapt_gemma_common(config, source, c, 0.0f, 0.0f));
  c->rope_local_theta = 10000.0f;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"rope_local_base_freq"}, &c->rope_local_theta));
  for (LayerSpec& l : c->layer) l.local_rope = l.window > 0;
  return Status::ok();
}

// Granite's four multipliers (GraniteConfig's defaults are all 1; its attention scale then
// is 1, not 1 / sqrt(head_dim)).
Status adapt_granite(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  float attention = 1.0f;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"attention_multiplier"}, &attention));
  for (LayerSpec& l : c->layer) l.attn_scale = attention;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"embedding_multiplier"}, &c->embed_scale));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"residual_multiplier"}, &c->residual_scale));
  return cf::read_positive_float(config, source, {"logits_scaling"}, &c->logit_scale);
}

// MiniCPM (1, 2): Granite's scalings under other names: embeddings times scale_emb, each
// sub-block's output times scale_depth / sqrt(layers), the final hidden state (so the logits)
// divided by hidden_size / dim_model_base. Required: the configuration class's defaults
// are not the released models' values. MiniCPM-MoE and MiniCPM 4's sparse attention refused.
Status adapt_minicpm(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  float depth = 1.0f, base = 1.0f;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"scale_emb"}, /*required=*/true, &c->embed_scale));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"scale_depth"}, /*required=*/true, &depth));
  TESSERA_RETURN_IF_ERROR(cf::read_positive_float(config, source, {"dim_model_base"}, /*required=*/true, &base));
  c->residual_scale = depth / std::sqrt(static_cast<float>(c->layers));
  c->logit_scale = static_cast<float>(c->hidden) / base;
  for (const char* key : {"num_experts", "sparse_config"}) {
    const nlohmann::json* v = cf::find(config, {key});
    if (v != nullptr && !(v->is_number() && v->get<double>() == 0)) {
      return unimplemented(source + ": \"" + std::string(key) + "\" " + v->dump() + " (MiniCPM's " +
                           (std::string(key) == "num_experts" ? "experts" : "sparse attention") + ") is not supported");
    }
  }
  return Status::ok();
}

// SmolLM3: no_rope_layers (1 = the layer rotates, 0 = NoPE), else every
// no_rope_layer_interval-th layer without positions (3, 7, 11, ... for 4, as SmolLM3Config
// fills it). A sliding window only with use_sliding_window: on the layers layer_types names
// (parse_windows read them), else on the NoPE layers.
Status adapt_smollm3(const nlohmann::json& config, const std::string& source, ModelConfig* c) {
  int64_t interval = 4;
  TESSERA_RETURN_IF_ERROR(cf::read_positive_int(config, source, {"no_rope_layer_interval"}, false, &interval));
  for (int64_t l = 0; l < c->layers; ++l) c->layer[l].rope = (l + 1) % interval != 0;
  if (const nlohmann::json* list = cf::find(config, {"no_rope_layers"})) {
    if (!list->is_array() || static_cast<int64_t>(list->size()) != c->layers) {
      return invalid_argument(source + ": \"no_rope_layers\" must list 0 or 1 per layer (" + std::to_string(c->layers) + ")");
    }
    for (int64_t l = 0; l < c->layers; ++l) {
      const nlohmann::json& v = (*list)[l];
      if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
        return invalid_argument(source + ": no_rope_layers[" + std::to_string(l) + "] must be 0 or 1, got " + v.dump());
      }
      c->layer[l].rope = v.get<int64_t>() == 1;
    }
  }
  bool use_window = false;
  TESSERA_RETURN_IF_ERROR(cf::read_bool(config, source, {"use_sliding_window"}, &use_window));
  const bool listed = cf::find(config, {"layer_types"}) != nullptr;
  for (LayerSpec& l : c->layer) {
    if (!use_window || (!listed && l.rope)) l.window = 0;
  }
  return Status::ok();
}

// ---- The rows ------------------------------------------------------------------------------

ArchSpec make_bloom() {
  ArchSpec s;
  s.name = "bloom";
  s.model_types = {"bloom"};
  s.hf_blocks = {"BloomBlock"};
  s.ds_types = {"bloom"};
  s.hf_architecture = "BloomForCausalLM";
  s.gguf_archs = {"bloom"};
  standard_gguf_names(s);
  s.biases = {R::kQkv, R::kO, R::kUp, R::kDown};
  s.config_extras = R"({"apply_residual_connection_post_layernorm": false, "hidden_dropout": 0.0,
                        "pretraining_tp": 1, "slow_but_exact": false})";
  s.norm = NormKind::kLayerNorm;
  s.position = PositionKind::kAlibi;
  s.qkv = QkvLayout::kGrouped;  // [head, (q|k|v), head_dim]: a group per head
  s.mlp = MlpKind::kDense;
  s.activation = Activation::kGeluTanh;  // bloom_gelu_forward; config.json names none
  s.ffn_multiple = 4;
  s.embedding_norm = true;
  s.tie_embeddings_default = true;
  s.keys.hidden = {"hidden_size", "n_embed", "d_model"};
  s.keys.layers = {"n_layer", "num_hidden_layers"};
  s.keys.heads = {"n_head", "num_attention_heads"};
  s.keys.kv_heads = {};
  s.keys.head_dim = {};
  s.keys.max_positions = {};
  s.keys.ffn = {};
  s.keys.norm_eps = {"layer_norm_epsilon", "layer_norm_eps"};
  s.keys.rope_theta = {};
  s.keys.activation = {};
  s.adapt = adapt_bloom;
  set(s, R::kEmbed, "transformer.word_embeddings.weight");
  set(s, R::kEmbedNorm, "transformer.word_embeddings_layernorm.weight");
  set(s, R::kFinalNorm, "transformer.ln_f.weight");
  set(s, R::kLmHead, "lm_head.weight");
  set(s, R::kAttnNorm, "transformer.h.{L}.input_layernorm.weight");
  set(s, R::kQkv, "transformer.h.{L}.self_attention.query_key_value.weight");
  set(s, R::kO, "transformer.h.{L}.self_attention.dense.weight");
  set(s, R::kMlpNorm, "transformer.h.{L}.post_attention_layernorm.weight");
  set(s, R::kUp, "transformer.h.{L}.mlp.dense_h_to_4h.weight");
  set(s, R::kDown, "transformer.h.{L}.mlp.dense_4h_to_h.weight");
  return s;
}

// The "model.layers.N.self_attn / mlp" layout shared by Llama and its descendants.
ArchSpec llama_layout() {
  ArchSpec s;
  standard_gguf_names(s);
  set(s, R::kEmbed, "model.embed_tokens.weight");
  set(s, R::kFinalNorm, "model.norm.weight");
  set(s, R::kLmHead, "lm_head.weight");
  set(s, R::kAttnNorm, "model.layers.{L}.input_layernorm.weight");
  set(s, R::kQ, "model.layers.{L}.self_attn.q_proj.weight");
  set(s, R::kK, "model.layers.{L}.self_attn.k_proj.weight");
  set(s, R::kV, "model.layers.{L}.self_attn.v_proj.weight");
  set(s, R::kO, "model.layers.{L}.self_attn.o_proj.weight");
  set(s, R::kMlpNorm, "model.layers.{L}.post_attention_layernorm.weight");
  set(s, R::kGate, "model.layers.{L}.mlp.gate_proj.weight");
  set(s, R::kUp, "model.layers.{L}.mlp.up_proj.weight");
  set(s, R::kDown, "model.layers.{L}.mlp.down_proj.weight");
  return s;
}

ArchSpec make_llama() {
  ArchSpec s = llama_layout();
  s.name = "llama";
  s.model_types = {"llama", "mistral"};
  s.hf_blocks = {"LlamaDecoderLayer", "MistralDecoderLayer"};
  s.ds_types = {"llama", "mistral"};
  s.hf_architecture = "LlamaForCausalLM";
  s.gguf_archs = {"llama"};
  s.gguf_permuted_qk = true;
  s.gguf_config = gguf_config_llama;
  s.config_extras = R"({"hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "pretraining_tp": 1,
                        "rope_scaling": null})";
  s.windows = WindowLayers::kAll;  // Mistral's sliding_window (Llama has none)
  return s;
}

// IBM Granite (3.x dense): Llama with multipliers on the embeddings, the attention scores,
// each sub-block's output and the logits.
ArchSpec make_granite() {
  ArchSpec s = llama_layout();
  s.name = "granite";
  s.model_types = {"granite"};
  s.hf_blocks = {"GraniteDecoderLayer"};
  s.hf_architecture = "GraniteForCausalLM";
  s.gguf_archs = {"granite"};
  s.gguf_permuted_qk = true;  // converted by llama.cpp's Llama converter
  s.gguf_config = gguf_config_granite;
  s.keys.head_dim = {};  // GraniteConfig has none: hidden / heads
  // Granite-3.1-2B's multipliers rather than GraniteConfig's defaults (all 1), so that a
  // generated checkpoint exercises them.
  s.config_extras = R"({"hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "rope_scaling": null,
                        "embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
                        "logits_scaling": 8.0})";
  s.adapt = adapt_granite;
  return s;
}

// MiniCPM 1 and 2 (openbmb): Llama with Granite-like scalings (adapt_minicpm).
ArchSpec make_minicpm() {
  ArchSpec s = llama_layout();
  s.name = "minicpm";
  s.model_types = {"minicpm"};
  s.hf_blocks = {"MiniCPMDecoderLayer"};
  s.hf_architecture = "MiniCPMForCausalLM";
  s.gguf_archs = {"minicpm"};
  s.gguf_permuted_qk = true;  // llama.cpp's MiniCPM converter permutes as Llama's
  s.gguf_config = gguf_config_minicpm;
  s.keys.head_dim = {};
  // MiniCPM-2B's scalings.
  s.config_extras = R"({"hidden_act": "silu", "rope_scaling": null, "scale_emb": 12, "scale_depth": 1.4,
                        "dim_model_base": 256})";
  s.tie_embeddings_default = true;
  s.adapt = adapt_minicpm;
  return s;
}

// SmolLM3: Llama with no positions in some layers (NoPE: every fourth by default).
ArchSpec make_smollm3() {
  ArchSpec s = llama_layout();
  s.name = "smollm3";
  s.model_types = {"smollm3"};
  s.hf_blocks = {"SmolLM3DecoderLayer"};
  s.hf_architecture = "SmolLM3ForCausalLM";
  s.gguf_archs = {"smollm3"};
  s.gguf_permuted_qk = true;  // converted by llama.cpp's Llama converter
  s.gguf_config = gguf_config_llama;
  s.rope_theta = 2e6f;
  s.config_extras = R"({"hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "rope_scaling": null,
                        "use_sliding_window": false, "sliding_window": null, "no_rope_layer_interval": 4})";
  s.tie_embeddings_default = true;
  s.windows = WindowLayers::kAll;  // narrowed by adapt_smollm3
  s.adapt = adapt_smollm3;
  return s;
}

ArchSpec make_mixtral() {
  ArchSpec s = llama_layout();
  s.name = "mixtral";
  s.model_types = {"mixtral"};
  s.hf_blocks = {"MixtralDecoderLayer"};
  s.ds_types = {"mixtral"};
  s.hf_architecture = "MixtralForCausalLM";
  s.gguf_archs = {"llama"};  // llama.cpp's Mixtral is a Llama with experts
  s.gguf_permuted_qk = true;
  s.gguf_config = gguf_config_llama;
  s.rope_theta = 1e6f;
  s.keys.experts = {"num_local_experts"};
  s.keys.moe_ffn = {};
  s.config_extras = R"({"hidden_act": "silu", "output_router_logits": false, "router_aux_loss_coef": 0.001,
                        "router_jitter_noise": 0.0, "sliding_window": null})";
  s.moe = true;
  s.windows = WindowLayers::kAll;
  for (R dense : {R::kGate, R::kUp, R::kDown}) set(s, dense, "");  // every layer is sparse
  set(s, R::kRouter, "model.layers.{L}.block_sparse_moe.gate.weight");
  set(s, R::kExpertGate, "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight");
  set(s, R::kExpertUp, "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight");
  set(s, R::kExpertDown, "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight");
  return s;
}

ArchSpec make_qwen2() {
  ArchSpec s = llama_layout();  // q/k/v biases are in the checkpoint and loaded as such
  s.name = "qwen2";
  s.model_types = {"qwen2"};
  s.hf_blocks = {"Qwen2DecoderLayer"};
  s.ds_types = {"qwen"};
  s.hf_architecture = "Qwen2ForCausalLM";
  s.gguf_archs = {"qwen2"};
  s.biases = {R::kQ, R::kK, R::kV};
  s.keys.head_dim = {};  // transformers' Qwen2 always uses hidden / heads
  s.config_extras = R"({"hidden_act": "silu", "use_sliding_window": false, "sliding_window": null,
                        "max_window_layers": 28, "rope_scaling": null})";
  s.windows = WindowLayers::kFromLayer;
  return s;
}

ArchSpec make_qwen3() {
  ArchSpec s = make_qwen2();
  s.name = "qwen3";
  s.model_types = {"qwen3"};
  s.hf_blocks = {"Qwen3DecoderLayer"};
  s.hf_architecture = "Qwen3ForCausalLM";
  s.gguf_archs = {"qwen3"};
  s.biases = {};
  s.keys.head_dim = {"head_dim"};
  s.config_extras = R"({"hidden_act": "silu", "attention_bias": false, "use_sliding_window": false,
                        "sliding_window": null, "max_window_layers": 28, "rope_scaling": null})";
  s.qk_norm = true;
  set(s, R::kQNorm, "model.layers.{L}.self_attn.q_norm.weight");
  set(s, R::kKNorm, "model.layers.{L}.self_attn.k_norm.weight");
  return s;
}

void qwen_moe_names(ArchSpec& s) {
  s.moe = true;
  set(s, R::kRouter, "model.layers.{L}.mlp.gate.weight");
  set(s, R::kExpertGate, "model.layers.{L}.mlp.experts.{E}.gate_proj.weight");
  set(s, R::kExpertUp, "model.layers.{L}.mlp.experts.{E}.up_proj.weight");
  set(s, R::kExpertDown, "model.layers.{L}.mlp.experts.{E}.down_proj.weight");
}

ArchSpec make_qwen3_moe() {
  ArchSpec s = make_qwen3();
  s.name = "qwen3_moe";
  s.model_types = {"qwen3_moe"};
  s.hf_blocks = {"Qwen3MoeDecoderLayer"};
  s.hf_architecture = "Qwen3MoeForCausalLM";
  s.gguf_archs = {"qwen3moe"};
  s.config_extras = R"({"hidden_act": "silu", "attention_bias": false, "use_sliding_window": false,
                        "sliding_window": null, "max_window_layers": 28, "rope_scaling": null,
                        "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
                        "output_router_logits": false, "router_aux_loss_coef": 0.001})";
  s.moe_normalize = false;  // Qwen3MoeConfig's default; the release configs say true
  qwen_moe_names(s);
  return s;
}

ArchSpec make_qwen2_moe() {
  ArchSpec s = make_qwen2();
  s.name = "qwen2_moe";
  s.model_types = {"qwen2_moe"};
  s.hf_blocks = {"Qwen2MoeDecoderLayer"};
  s.hf_architecture = "Qwen2MoeForCausalLM";
  s.gguf_archs = {"qwen2moe"};
  s.config_extras = R"({"hidden_act": "silu", "use_sliding_window": false, "sliding_window": null,
                        "max_window_layers": 28, "rope_scaling": null, "norm_topk_prob": false,
                        "decoder_sparse_step": 1, "mlp_only_layers": [], "output_router_logits": false,
                        "router_aux_loss_coef": 0.001})";
  s.moe_normalize = false;
  s.shared_expert = true;
  qwen_moe_names(s);
  set(s, R::kSharedGate, "model.layers.{L}.mlp.shared_expert.gate_proj.weight");
  set(s, R::kSharedUp, "model.layers.{L}.mlp.shared_expert.up_proj.weight");
  set(s, R::kSharedDown, "model.layers.{L}.mlp.shared_expert.down_proj.weight");
  set(s, R::kSharedExpertGate, "model.layers.{L}.mlp.shared_expert_gate.weight");
  return s;
}

ArchSpec make_phi3() {
  ArchSpec s = llama_layout();
  s.name = "phi3";
  s.model_types = {"phi3"};
  s.hf_blocks = {"Phi3DecoderLayer"};
  s.ds_types = {"phi"};
  s.hf_architecture = "Phi3ForCausalLM";
  s.gguf_archs = {"phi3"};
  s.gguf_config = gguf_config_phi3;
  s.keys.head_dim = {};
  s.config_extras = R"({"hidden_act": "silu", "partial_rotary_factor": 1.0, "rope_scaling": null,
                        "sliding_window": null, "original_max_position_embeddings": 4096,
                        "embd_pdrop": 0.0, "resid_pdrop": 0.0})";
  s.qkv = QkvLayout::kConcat;
  s.windows = WindowLayers::kAll;
  s.keys.rotary_fraction = {"partial_rotary_factor"};
  set(s, R::kQ, "");
  set(s, R::kK, "");
  set(s, R::kV, "");
  set(s, R::kQkv, "model.layers.{L}.self_attn.qkv_proj.weight");
  set(s, R::kGate, "");
  set(s, R::kUp, "");
  set(s, R::kGateUp, "model.layers.{L}.mlp.gate_up_proj.weight");
  return s;
}

ArchSpec make_gemma2() {
  ArchSpec s = llama_layout();
  s.name = "gemma2";
  s.model_types = {"gemma2"};
  s.hf_blocks = {"Gemma2DecoderLayer"};
  s.ds_types = {"gemma"};
  s.hf_architecture = "Gemma2ForCausalLM";
  s.gguf_archs = {"gemma2"};
  s.gguf_config = gguf_config_gemma2;
  s.config_extras = R"({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096,
                        "attention_bias": false, "cache_implementation": "hybrid"})";
  s.norm_weight_offset = 1.0f;
  s.activation = Activation::kGeluTanh;
  s.keys.activation = {"hidden_activation", "hidden_act"};
  s.post_norms = true;
  s.tie_embeddings_default = true;
  s.windows = WindowLayers::kEven;
  s.adapt = adapt_gemma2;
  set(s, R::kPostAttnNorm, "model.layers.{L}.post_attention_layernorm.weight");
  set(s, R::kMlpNorm, "model.layers.{L}.pre_feedforward_layernorm.weight");
  set(s, R::kPostMlpNorm, "model.layers.{L}.post_feedforward_layernorm.weight");
  return s;
}

ArchSpec make_gemma3() {
  ArchSpec s = make_gemma2();
  s.name = "gemma3";
  s.model_types = {"gemma3_text"};
  s.hf_blocks = {"Gemma3DecoderLayer"};
  s.hf_architecture = "Gemma3ForCausalLM";
  s.gguf_archs = {"gemma3"};
  s.gguf_config = gguf_config_gemma3;
  s.rope_theta = 1e6f;
  s.config_extras = R"({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                        "attn_logit_softcapping": null, "final_logit_softcapping": null, "sliding_window": 512,
                        "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0, "rope_scaling": null,
                        "attention_bias": false})";
  s.qk_norm = true;
  s.windows = WindowLayers::kPattern;
  s.adapt = adapt_gemma3;
  set(s, R::kQNorm, "model.layers.{L}.self_attn.q_norm.weight");
  set(s, R::kKNorm, "model.layers.{L}.self_attn.k_norm.weight");
  return s;
}

ArchSpec make_falcon() {
  ArchSpec s;
  s.name = "falcon";
  s.model_types = {"falcon", "RefinedWeb", "RefinedWebModel"};
  s.hf_blocks = {"FalconDecoderLayer"};
  s.ds_types = {"falcon"};
  s.hf_architecture = "FalconForCausalLM";
  s.gguf_archs = {"falcon"};
  standard_gguf_names(s);
  s.gguf_config = gguf_config_falcon;
  // Alternatives as in the Hugging Face names (worker/arch_tensors.h layout_alternative): the
  // two-norm block's ln_attn is attn_norm_2 and its ln_mlp attn_norm.
  set_gguf(s, R::kAttnNorm, "blk.{L}.attn_norm.weight|blk.{L}.attn_norm_2.weight");
  set_gguf(s, R::kMlpNorm, "blk.{L}.ffn_norm.weight|blk.{L}.attn_norm.weight");
  // Generated Falcons use the new decoder architecture (Falcon-40B/180B: grouped KV heads,
  // ln_attn + ln_mlp); the fixtures cover the Falcon-7B layout.
  s.config_extras = R"({"activation": "gelu", "alibi": false, "bias": false, "multi_query": true,
                        "new_decoder_architecture": true, "num_ln_in_parallel_attn": null, "parallel_attn": true,
                        "rope_scaling": null, "hidden_dropout": 0.0})";
  s.norm = NormKind::kLayerNorm;
  s.qkv = QkvLayout::kConcat;  // adapt_falcon picks the layout from the flags
  s.mlp = MlpKind::kDense;
  s.activation = Activation::kGeluErf;
  s.ffn_multiple = 4;
  s.block = BlockKind::kParallel;
  s.tie_embeddings_default = true;
  s.keys.hidden = {"hidden_size", "n_embed"};
  s.keys.layers = {"num_hidden_layers", "n_layer"};
  s.keys.heads = {"num_attention_heads", "n_head"};
  // num_kv_heads only counts with new_decoder_architecture; adapt_falcon decides.
  s.keys.kv_heads = {"num_kv_heads", "n_head_kv"};
  s.keys.head_dim = {};
  s.keys.ffn = {"ffn_hidden_size"};
  s.keys.norm_eps = {"layer_norm_epsilon"};
  s.keys.activation = {"activation"};
  s.adapt = adapt_falcon;
  set(s, R::kEmbed, "transformer.word_embeddings.weight");
  set(s, R::kFinalNorm, "transformer.ln_f.weight");
  set(s, R::kLmHead, "lm_head.weight");
  set(s, R::kAttnNorm, "transformer.h.{L}.input_layernorm.weight|transformer.h.{L}.ln_attn.weight");
  set(s, R::kQkv, "transformer.h.{L}.self_attention.query_key_value.weight");
  set(s, R::kO, "transformer.h.{L}.self_attention.dense.weight");
  set(s, R::kMlpNorm, "transformer.h.{L}.post_attention_layernorm.weight|transformer.h.{L}.ln_mlp.weight");
  set(s, R::kUp, "transformer.h.{L}.mlp.dense_h_to_4h.weight");
  set(s, R::kDown, "transformer.h.{L}.mlp.dense_4h_to_h.weight");
  return s;
}

ArchSpec make_gpt_neox() {
  ArchSpec s;
  s.name = "gpt_neox";
  s.model_types = {"gpt_neox"};
  s.hf_blocks = {"GPTNeoXLayer"};
  s.ds_types = {"gpt_neox", "gptneox", "pythia"};
  s.hf_architecture = "GPTNeoXForCausalLM";
  s.gguf_archs = {"gptneox"};
  standard_gguf_names(s);
  s.gguf_config = gguf_config_gpt_neox;
  s.biases = {R::kQkv, R::kO, R::kUp, R::kDown};
  s.config_extras = R"({"hidden_act": "gelu", "rotary_pct": 0.25, "use_parallel_residual": true,
                        "attention_bias": true, "rope_scaling": null})";
  s.norm = NormKind::kLayerNorm;
  s.qkv = QkvLayout::kGrouped;  // view [heads, 3 * head_dim]: a group per head
  s.mlp = MlpKind::kDense;
  s.activation = Activation::kGeluErf;
  s.block = BlockKind::kParallel;
  s.keys.kv_heads = {};
  s.keys.head_dim = {};
  s.keys.norm_eps = {"layer_norm_eps"};
  s.keys.rope_theta = {"rotary_emb_base", "rope_theta"};
  s.keys.rotary_fraction = {"partial_rotary_factor", "rotary_pct"};
  s.adapt = adapt_gpt_neox;
  set(s, R::kEmbed, "gpt_neox.embed_in.weight");
  set(s, R::kFinalNorm, "gpt_neox.final_layer_norm.weight");
  set(s, R::kLmHead, "embed_out.weight");
  set(s, R::kAttnNorm, "gpt_neox.layers.{L}.input_layernorm.weight");
  set(s, R::kQkv, "gpt_neox.layers.{L}.attention.query_key_value.weight");
  set(s, R::kO, "gpt_neox.layers.{L}.attention.dense.weight");
  set(s, R::kMlpNorm, "gpt_neox.layers.{L}.post_attention_layernorm.weight");
  set(s, R::kUp, "gpt_neox.layers.{L}.mlp.dense_h_to_4h.weight");
  set(s, R::kDown, "gpt_neox.layers.{L}.mlp.dense_4h_to_h.weight");
  return s;
}

ArchSpec make_gpt2() {
  ArchSpec s;
  s.name = "gpt2";
  s.model_types = {"gpt2"};
  s.hf_blocks = {"GPT2Block"};
  s.ds_types = {"gpt2"};
  s.hf_architecture = "GPT2LMHeadModel";
  s.gguf_archs = {"gpt2"};
  standard_gguf_names(s);
  s.biases = {R::kQkv, R::kO, R::kUp, R::kDown};
  s.config_extras = R"({"activation_function": "gelu_new", "n_ctx": 1024, "reorder_and_upcast_attn": false,
                        "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true,
                        "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1})";
  s.norm = NormKind::kLayerNorm;
  s.position = PositionKind::kLearned;
  s.qkv = QkvLayout::kConcat;  // c_attn columns q | k | v
  s.mlp = MlpKind::kDense;
  s.activation = Activation::kGeluTanh;  // gelu_new
  s.ffn_multiple = 4;
  s.conv1d_weights = true;
  s.tie_embeddings_default = true;
  s.keys.hidden = {"n_embd", "hidden_size"};
  s.keys.layers = {"n_layer", "num_hidden_layers"};
  s.keys.heads = {"n_head", "num_attention_heads"};
  s.keys.kv_heads = {};
  s.keys.head_dim = {};
  s.keys.ffn = {"n_inner"};
  s.keys.norm_eps = {"layer_norm_epsilon"};
  s.keys.rope_theta = {};
  s.keys.max_positions = {"n_positions", "max_position_embeddings"};
  s.keys.activation = {"activation_function"};
  s.adapt = adapt_gpt2;
  set(s, R::kEmbed, "transformer.wte.weight");
  set(s, R::kPosEmbed, "transformer.wpe.weight");
  set(s, R::kFinalNorm, "transformer.ln_f.weight");
  set(s, R::kLmHead, "lm_head.weight");
  set(s, R::kAttnNorm, "transformer.h.{L}.ln_1.weight");
  set(s, R::kQkv, "transformer.h.{L}.attn.c_attn.weight");
  set(s, R::kO, "transformer.h.{L}.attn.c_proj.weight");
  set(s, R::kMlpNorm, "transformer.h.{L}.ln_2.weight");
  set(s, R::kUp, "transformer.h.{L}.mlp.c_fc.weight");
  set(s, R::kDown, "transformer.h.{L}.mlp.c_proj.weight");
  return s;
}

ArchSpec make_starcoder2() {
  ArchSpec s = llama_layout();
  s.name = "starcoder2";
  s.model_types = {"starcoder2"};
  s.hf_blocks = {"Starcoder2DecoderLayer"};
  s.ds_types = {"starcoder"};
  s.hf_architecture = "Starcoder2ForCausalLM";
  s.gguf_archs = {"starcoder2"};
  s.biases = {R::kQ, R::kK, R::kV, R::kO, R::kUp, R::kDown};
  s.keys.head_dim = {};
  s.config_extras = R"({"hidden_act": "gelu_pytorch_tanh", "use_bias": true, "sliding_window": 4096,
                        "rope_scaling": null})";
  s.norm = NormKind::kLayerNorm;
  s.mlp = MlpKind::kDense;
  s.activation = Activation::kGeluTanh;
  s.tie_embeddings_default = true;
  s.windows = WindowLayers::kAll;
  s.keys.norm_eps = {"norm_epsilon", "layer_norm_epsilon"};
  set(s, R::kGate, "");
  set(s, R::kUp, "model.layers.{L}.mlp.c_fc.weight");
  set(s, R::kDown, "model.layers.{L}.mlp.c_proj.weight");
  return s;
}

}  // namespace

const char* tensor_role_name(TensorRole role) {
  static const char* kNames[] = {
      "embed",     "pos_embed",     "embed_norm",   "final_norm",   "lm_head",   "attn_norm",   "q",
      "k",         "v",             "qkv",          "q_norm",       "k_norm",    "o",           "post_attn_norm",
      "mlp_norm",  "gate",          "up",           "gate_up",      "down",      "post_mlp_norm", "router",
      "expert_gate", "expert_up",   "expert_down",  "shared_gate",  "shared_up", "shared_down", "shared_expert_gate"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(TensorRole::kCount));
  return kNames[static_cast<size_t>(role)];
}

const std::vector<ArchSpec>& arch_specs() {
  static const std::vector<ArchSpec> specs = {make_bloom(),     make_llama(),     make_mixtral(), make_qwen2(),
                                              make_qwen3(),     make_qwen3_moe(), make_qwen2_moe(), make_phi3(),
                                              make_gemma2(),    make_gemma3(),    make_falcon(),  make_gpt_neox(),
                                              make_gpt2(),      make_starcoder2(), make_granite(), make_smollm3(), make_minicpm()};
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

const ArchSpec* find_arch_by_block(const std::string& block) {
  for (const ArchSpec& spec : arch_specs()) {
    for (const std::string& b : spec.hf_blocks) {
      if (b == block) return &spec;
    }
  }
  return nullptr;
}

std::string supported_gguf_archs() {
  std::vector<std::string> archs;
  for (const ArchSpec& spec : arch_specs())
    for (const std::string& a : spec.gguf_archs)
      if (std::find(archs.begin(), archs.end(), a) == archs.end()) archs.push_back(a);
  std::sort(archs.begin(), archs.end());
  std::string out;
  for (const std::string& a : archs) out += (out.empty() ? "" : ", ") + a;
  return out;
}

std::string supported_model_types() {
  std::string out;
  for (const ArchSpec& spec : arch_specs()) {
    for (const std::string& t : spec.model_types) out += (out.empty() ? "" : ", ") + t;
  }
  return out;
}

bool accepted_ds_type(const std::string& type) {
  const std::string t = ascii_lower(type);
  if (t == "ds_model") return true;
  for (const ArchSpec& spec : arch_specs()) {
    for (const std::string& prefix : spec.ds_types) {
      if (t.rfind(prefix, 0) == 0) return true;
    }
  }
  return false;
}

std::string accepted_ds_types() {
  std::string out;
  for (const ArchSpec& spec : arch_specs()) {
    for (const std::string& prefix : spec.ds_types) out += prefix + "*, ";
  }
  return out + "ds_model";
}

std::string tensor_name(const std::string& pattern, int layer, int expert) {
  std::string s = replace_all(pattern, "{L}", std::to_string(layer));
  return expert >= 0 ? replace_all(s, "{E}", std::to_string(expert)) : s;
}

std::vector<std::string> name_alternatives(const std::string& pattern) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t bar = pattern.find('|', start);
    out.push_back(pattern.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) return out;
    start = bar + 1;
  }
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
