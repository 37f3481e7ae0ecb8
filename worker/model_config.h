#pragma once
// The shape of a model, read from a Hugging Face config.json through its ArchSpec row.
// Every missing or inconsistent key is an error naming config.json and the key; every
// field that would change the computation in a way Tessera does not implement (another
// rope_type, an unknown activation) is refused by name, never approximated.
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/arch_spec.h"

namespace tessera {

// rope_scaling from config.json: how the inverse frequencies are changed.
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3, kLongRope, kYarn };
  Kind kind = Kind::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int64_t original_max_positions = 0;  // llama3, longrope, yarn
  // longrope (Phi-3's "su", Phi-3.5, Phi-4-mini): each rotary pair's wavelength multiplied by
  // short_factor[i] for a model serving at most original_max_positions tokens, by
  // long_factor[i] beyond; cos and sin scaled by attention_factor.
  std::vector<float> short_factor, long_factor;
  float attention_factor = 1.0f;  // longrope, yarn: cos and sin scaled by it
  // yarn (Qwen 2.5 / Qwen 3 long context): pairs turning fewer than beta_slow times over the
  // original context are divided by factor, more than beta_fast times kept, a linear ramp
  // between (bounds floored and ceiled unless truncate is false).
  float beta_fast = 32.0f, beta_slow = 1.0f;
  bool truncate = true;
};

// What differs between the layers of one model.
struct LayerSpec {
  int32_t window = 0;       // sliding window in tokens; 0 = full causal attention
  bool moe = false;         // routed experts here (else the dense MLP)
  bool local_rope = false;  // RoPE with rope_local_theta and no scaling (Gemma 3's sliding layers)
  bool rope = true;         // false: no positions at all in this layer (SmolLM3's NoPE layers)
  float attn_scale = 1.0f;  // score multiplier
};

struct ModelConfig {
  const ArchSpec* arch = nullptr;
  std::string model_type;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;  // dense MLP width (also of MoE models' dense layers)
  int64_t vocab = 0;
  float norm_eps = 1e-5f;
  // Resolved from the row and config.json.
  QkvLayout qkv = QkvLayout::kSeparate;
  BlockKind block = BlockKind::kSequential;
  // Parallel blocks: whether the MLP has a norm of its own (GPT-NeoX; Falcon-40B's ln_mlp)
  // or shares the attention's (Falcon-7B). Sequential blocks always have one.
  bool mlp_norm = true;
  Activation activation = Activation::kSilu;
  float rope_theta = 10000.0f;
  float rope_local_theta = 0.0f;  // > 0: base of the layers with local_rope
  RopeScaling rope_scaling;
  int64_t rotary_dim = 0;  // leading dims of each head that RoPE rotates (= head_dim unless partial)
  float attn_softcap = 0.0f;   // Gemma 2 attn_logit_softcapping; 0 = none
  float final_softcap = 0.0f;  // Gemma 2 final_logit_softcapping; 0 = none
  float embed_scale = 1.0f;    // embeddings multiplied by it (Gemma: sqrt(hidden); Granite's, MiniCPM's multiplier)
  // Whether embed_scale is first rounded to the weight dtype (Gemma: torch.tensor(sqrt(h),
  // dtype)); Granite multiplies by a Python float, which PyTorch keeps in float32.
  bool embed_scale_in_dtype = false;
  float residual_scale = 1.0f;  // Granite residual_multiplier: each sub-block's output times this
  float logit_scale = 1.0f;     // Granite logits_scaling: the logits divided by this
  bool tie_embeddings = false;
  int64_t num_experts = 0;  // MoE only
  int64_t top_k = 0;        // MoE only
  int64_t moe_ffn = 0;      // width of each routed expert
  int64_t shared_ffn = 0;   // width of the shared expert (Qwen2-MoE); 0 = none
  bool moe_normalize = true;
  int64_t max_positions = 0;  // 0 = unknown (ALiBi has no hard limit)
  // The longest sequence this model serves (scheduler.max_model_len), set by the loader; 0 =
  // max_positions. LongRoPE picks its factors by it.
  int64_t served_context = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  std::vector<LayerSpec> layer;  // [layers]

  bool has_moe() const { return num_experts > 0; }
  // The window shared by every layer, or 0 when some layer attends to the whole context:
  // only then can a sequence's KV blocks that fell out of the window be freed.
  int32_t kv_window() const;
};

// `source` names the file in messages (e.g. "models/x/config.json").
StatusOr<ModelConfig> parse_model_config(const nlohmann::json& config, const std::string& source);

// Whether a prompt can run on this model: non-empty, every id inside the vocabulary, and
// prompt + max_new_tokens within the context of a model with positions that end (rotary,
// learned). `who` names the request in the message ("prompt 3").
Status check_prompt(const std::vector<int32_t>& prompt, int max_new_tokens, const ModelConfig& config,
                    const std::string& who);

// RoPE inverse frequencies of one layer ([rotary_dim / 2]), computed as transformers does
// in float32 (_compute_default_rope_parameters, then the linear, llama3, longrope or yarn
// scaling).
// LongRoPE takes its long factors when the model serves more than original_max_positions
// tokens (served_context, else max_positions), else its short ones, for every position: as
// llama.cpp chooses (by its context size), so a position's rotation never depends on the
// batch or on how a prompt was chunked. (transformers chooses per forward pass by the
// sequence's length, so its keys before that length keep the short factors.)
std::vector<float> rope_inv_freq(const ModelConfig& config, int layer);
// The factor cos and sin of one layer's rotary are scaled by: LongRoPE's or YaRN's attention
// factor, else 1.
float rope_magnitude(const ModelConfig& config, int layer);
// Whether LongRoPE's long factors are in use (for the load log).
bool rope_uses_long_factors(const ModelConfig& config);

}  // namespace tessera
