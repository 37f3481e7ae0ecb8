#pragma once
// An architecture is a row in a table, not a class: BLOOM, Llama, Qwen, Gemma, Falcon,
// GPT-NeoX, GPT-2 ... differ in a handful of switches (norm, positions, QKV packing, MLP
// kind, residual wiring), in config.json key names and in tensor names. One transformer
// block (worker/transformer.cc) reads these switches; adding a model family means adding
// a row in arch_spec.cc plus its tests. Everything per family lives in its row: config
// keys and their defaults, tensor names, the Hugging Face block classes that
// `injection_policy` may name, DeepSpeed checkpoint "type" prefixes, and (through the
// tensor roles) the built-in auto-TP policy.
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/activation.h"

namespace tessera {

struct ModelConfig;
class GgufFile;

enum class NormKind { kLayerNorm, kRmsNorm };
// kLearned: a position-embedding table added to the token embeddings (GPT-2).
enum class PositionKind { kRotary, kAlibi, kLearned };
// How q, k and v weights are stored (each a [rows, hidden] matrix, rows grouped per head):
// kSeparate: q_proj, k_proj, v_proj.
// kConcat:   one weight, rows [q heads | k heads | v heads] (Phi-3 qkv_proj, Falcon
//            multi-query, GPT-2 c_attn).
// kGrouped:  one weight, rows per KV group [the group's q heads, its k head, its v head]
//            (BLOOM and GPT-NeoX: one query head per group; Falcon's
//            new_decoder_architecture: heads / kv_heads query heads per group).
enum class QkvLayout { kSeparate, kConcat, kGrouped };
// kDense: down(act(up(x))). kGated: down(act(gate(x)) * up(x)) (SwiGLU, GeGLU).
enum class MlpKind { kDense, kGated };
// kSequential: x += attn(norm1(x)); x += mlp(norm2(x)).
// kParallel:   x += attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX, Falcon; norm2 may be norm1).
enum class BlockKind { kSequential, kParallel };
// Which layers use config.json's "sliding_window" (when it is set and no "layer_types"
// list says otherwise).
enum class WindowLayers {
  kNone,       // the family has no sliding window
  kAll,        // every layer (Mistral, Phi-3, StarCoder2)
  kEven,       // layers 0, 2, 4, ... (Gemma 2)
  kPattern,    // all but every sliding_window_pattern-th layer (Gemma 3)
  kFromLayer,  // layers >= max_window_layers, when use_sliding_window (Qwen2/3)
};

// Every weight a transformer can have. Patterns below name them per architecture.
enum class TensorRole {
  kEmbed,
  kPosEmbed,  // learned positions (GPT-2 wpe)
  kEmbedNorm,
  kFinalNorm,
  kLmHead,
  kAttnNorm,
  kQ,
  kK,
  kV,
  kQkv,
  kQNorm,  // per-head RMSNorm of q and k (Qwen3, Gemma 3)
  kKNorm,
  kO,
  kPostAttnNorm,  // Gemma 2/3: norm of the attention output before the residual add
  kMlpNorm,
  kGate,    // dense gated MLP: the activated branch
  kUp,      // dense gated MLP: the linear branch; dense MLP: h -> 4h
  kGateUp,  // fused gate|up (Phi-3): rows [gate | up]
  kDown,    // down / 4h -> h
  kPostMlpNorm,  // Gemma 2/3
  kRouter,
  kExpertGate,  // routed experts ("{E}" is the expert)
  kExpertUp,
  kExpertDown,
  kSharedGate,  // Qwen2-MoE's shared expert, and the sigmoid gate that scales it
  kSharedUp,
  kSharedDown,
  kSharedExpertGate,
  kCount
};
const char* tensor_role_name(TensorRole role);
// A routed expert's matrix (stored once per expert, or stacked in GGUF files).
inline bool is_expert_role(TensorRole role) {
  return role == TensorRole::kExpertGate || role == TensorRole::kExpertUp || role == TensorRole::kExpertDown;
}

// config.json key names, each a list of aliases (the first one present wins: configs of
// different ages and families spell the same thing differently).
struct ConfigKeys {
  std::vector<std::string> hidden{"hidden_size"};
  std::vector<std::string> layers{"num_hidden_layers"};
  std::vector<std::string> heads{"num_attention_heads"};
  std::vector<std::string> kv_heads{"num_key_value_heads"};  // absent: = heads
  std::vector<std::string> head_dim{"head_dim"};              // absent: hidden / heads
  std::vector<std::string> ffn{"intermediate_size"};          // absent or null: ffn_multiple * hidden
  std::vector<std::string> norm_eps{"rms_norm_eps"};
  std::vector<std::string> rope_theta{"rope_theta"};
  std::vector<std::string> rotary_fraction;  // share of head_dim that is rotated (GPT-NeoX, Phi-3)
  std::vector<std::string> max_positions{"max_position_embeddings"};
  std::vector<std::string> activation{"hidden_act"};  // empty: the row's fixed activation
  std::vector<std::string> experts{"num_experts", "num_local_experts"};  // MoE rows
  std::vector<std::string> moe_ffn{"moe_intermediate_size"};  // absent: the dense width
};

struct ArchSpec {
  std::string name;                      // "llama"
  std::vector<std::string> model_types;  // config.json "model_type" values served by this row
  std::vector<std::string> hf_blocks;    // Hugging Face decoder-layer classes (injection_policy keys)
  std::vector<std::string> ds_types;     // DeepSpeed checkpoint JSON "type" prefixes (case-insensitive)
  std::string hf_architecture;           // config.json "architectures" entry ("LlamaForCausalLM")
  NormKind norm = NormKind::kRmsNorm;
  float norm_weight_offset = 0.0f;  // Gemma's RMSNorm multiplies by (1 + weight)
  PositionKind position = PositionKind::kRotary;
  float rope_theta = 10000.0f;  // the configuration class's default, when config.json has none
  QkvLayout qkv = QkvLayout::kSeparate;
  MlpKind mlp = MlpKind::kGated;
  Activation activation = Activation::kSilu;  // when config.json names none
  int64_t ffn_multiple = 0;                   // ffn = this * hidden when config.json has no ffn key
  BlockKind block = BlockKind::kSequential;
  bool moe = false;            // routed experts (in every layer, or as mlp_only_layers say)
  bool moe_normalize = true;   // top-k weights renormalised, unless norm_topk_prob says otherwise
  bool shared_expert = false;  // Qwen2-MoE
  bool post_norms = false;     // Gemma's norms on the sub-block outputs
  bool qk_norm = false;        // per-head q/k RMSNorm before RoPE
  bool embedding_norm = false;  // BLOOM's word_embeddings_layernorm
  bool conv1d_weights = false;  // GPT-2's Conv1D: linear weights stored [in, out]
  bool tie_embeddings_default = false;  // when config.json has no tie_word_embeddings
  WindowLayers windows = WindowLayers::kNone;
  ConfigKeys keys;
  // Linear roles whose weights have a bias in this family's checkpoints (LayerNorms always
  // have one). The loader reads any bias a checkpoint holds; this list is what a
  // generated checkpoint writes (tessera-make-checkpoint).
  std::vector<TensorRole> biases;
  // The family-specific keys a config.json of this family carries, as JSON with the
  // values transformers writes for a default config (activation names, flags); the
  // generator writes them beside the shape keys of ConfigKeys.
  const char* config_extras = "{}";
  // Family-specific config.json fields (Falcon's QKV layout flags, Gemma's soft-caps, ...),
  // applied after the generic keys; refuses values Tessera does not compute.
  Status (*adapt)(const nlohmann::json& config, const std::string& source, ModelConfig* c) = nullptr;
  // Weight tensor names: "{L}" is the layer index, "{E}" the expert index; "a|b" lists
  // alternatives, the first one the checkpoint has is used (Falcon's norms are named by
  // its config flags). Norm and linear biases are the same name with ".weight" replaced
  // by ".bias"; a linear bias is loaded when the checkpoint has it. Empty means the
  // architecture has no such tensor.
  std::array<std::string, static_cast<size_t>(TensorRole::kCount)> names;

  // GGUF files (llama.cpp's format, worker/gguf_checkpoint.h): the general.architecture
  // values this row serves (a MoE row takes the files whose expert_count is set) and each
  // role's tensor name there ("blk.{L}.attn_q.weight"; biases ".bias" likewise). Routed
  // experts are one stacked [experts, rows, in] tensor ("blk.{L}.ffn_gate_exps.weight").
  std::vector<std::string> gguf_archs;
  std::array<std::string, static_cast<size_t>(TensorRole::kCount)> gguf_names;
  // How llama.cpp's converter changed this family's tensors on the way into GGUF:
  // kPermutedQk: Llama's Q and K rows are interleaved per head for its rotary layout;
  // fused QKV of kGrouped/Falcon layouts is written as [q | k | v] (gguf_checkpoint.cc).
  bool gguf_permuted_qk = false;
  // Family-specific GGUF metadata into config.json keys (soft-caps, windows, flags), after
  // the generic ones; nullptr when the generic keys say everything (worker/arch_gguf.h).
  Status (*gguf_config)(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                        std::vector<std::string>* consumed) = nullptr;

  const std::string& name_of(TensorRole role) const { return names[static_cast<size_t>(role)]; }
  const std::string& gguf_name_of(TensorRole role) const { return gguf_names[static_cast<size_t>(role)]; }
};

// The built-in table.
const std::vector<ArchSpec>& arch_specs();
// Row serving config.json's model_type; nullptr when none does.
const ArchSpec* find_arch_spec(const std::string& model_type);
// Row whose Hugging Face block class is `block` ("LlamaDecoderLayer"); nullptr when none.
const ArchSpec* find_arch_by_block(const std::string& block);
// "bloom, falcon, gemma2, ..." — the GGUF general.architecture values served, for errors.
std::string supported_gguf_archs();
// "bloom, llama, mistral, mixtral, ..." — for error messages.
std::string supported_model_types();
// Whether a DeepSpeed checkpoint JSON "type" names a family of the table.
bool accepted_ds_type(const std::string& type);
// "BLOOM*, Llama*, ..." — for error messages.
std::string accepted_ds_types();

// Expands "{L}" and "{E}" in a pattern.
std::string tensor_name(const std::string& pattern, int layer, int expert = -1);
// The alternatives of a "a|b" pattern (one element when there are none).
std::vector<std::string> name_alternatives(const std::string& pattern);
// "x.weight" -> "x.bias".
std::string bias_name(const std::string& weight_name);

}  // namespace tessera
