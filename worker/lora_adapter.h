#pragma once
// A LoRA adapter as people have it: a PEFT folder (adapter_config.json with adapter_model.
// safetensors or adapter_model.bin), or llama.cpp's GGUF adapter file presented as one
// (worker/gguf_lora_adapter.h), read against the base model it adapts. Each adapted
// linear layer gets a low-rank update: y = W x + scale · B (A x), with A [r, in] and B [out, r]
// as PEFT stores them (also for GPT-2's Conv1D layers: fan_in_fan_out only transposes the
// merged delta) and scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
//
// What would change the computation and is not implemented is refused at load, naming the
// field: DoRA (use_dora, lora_magnitude_vector tensors), modules_to_save, biases (bias other
// than "none", lora_bias), per-module ranks or alphas (rank_pattern, alpha_pattern), layer
// selection (layers_to_transform), layer replication, Megatron layers, and adapters of the
// embedding or LM head. Fields that only shape training (lora_dropout, init_lora_weights,
// loftq_config, task_type, ...) are accepted and have no effect on inference.
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/status.h"
#include "common/tensor.h"
#include "worker/arch_spec.h"
#include "worker/model_config.h"

namespace tessera {

struct LoraAdapterConfig {
  int rank = 0;
  double alpha = 8;  // PEFT's default lora_alpha
  bool rslora = false;
  bool fan_in_fan_out = false;
  // target_modules: a list of names (a module is targeted when its name is one of them or
  // ends with "." and one), or one regular expression the whole module name must match, or
  // "all-linear" (every linear layer of the blocks).
  std::vector<std::string> target_names;
  std::optional<std::regex> target_regex;
  bool all_linear = false;

  double scale() const;
  // Whether the module `name` ("model.layers.0.self_attn.q_proj") is targeted.
  bool targets(const std::string& name) const;
};

// adapter_config.json's fields checked as the header says; `source` names the file in errors.
StatusOr<LoraAdapterConfig> parse_lora_adapter_config(const nlohmann::json& config, const std::string& source);

// A linear layer of the base's blocks an adapter may change: its PEFT module name (its weight's
// name in the base's checkpoint less ".weight", as the base's ArchSpec row spells it), which
// one it is and its [out, in] (GPT-2's Conv1D weights, stored [in, out], turned round).
struct LoraTargetModule {
  std::string name;
  TensorRole role = TensorRole::kQ;
  int layer = 0;
  int expert = -1;  // routed experts only
  int64_t out = 0, in = 0;
};
// The roles of those layers: the dense ones, then the routed experts' (is_expert_role).
const std::vector<TensorRole>& lora_adaptable_roles();

// Every such layer of `base`, in the order of its layers, experts and roles.
std::vector<LoraTargetModule> lora_target_modules(const Checkpoint& base, const ModelConfig& config);

// One adapted linear layer: which one, and its factors in f32.
struct LoraModule {
  LoraTargetModule target;
  Tensor a;  // [rank, in]
  Tensor b;  // [out, rank]
};

struct LoraAdapter {
  std::string path;  // the folder or file
  LoraAdapterConfig config;
  std::vector<LoraModule> modules;  // in the order of the base's layers, experts and roles
};

// Reads the adapter in `dir` (a PEFT folder or a .gguf adapter file) for the base model `base`
// (its checkpoint and parsed config):
// every lora_A / lora_B pair must belong to a linear layer of the base's blocks (named as the
// base's ArchSpec row names it), be targeted by target_modules, have the configured rank (at
// most `max_rank`) and the base layer's input and output sizes. Errors name the file and the
// field or tensor.
StatusOr<LoraAdapter> load_lora_adapter(const std::string& dir, const Checkpoint& base, const ModelConfig& config,
                                        int max_rank);

}  // namespace tessera
