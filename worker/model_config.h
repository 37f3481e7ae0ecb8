#pragma once
// The shape of a model, read from a Hugging Face config.json through its ArchSpec row.
// Every missing or inconsistent key is an error naming config.json and the key.
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/arch_spec.h"

namespace tessera {

struct ModelConfig {
  const ArchSpec* arch = nullptr;
  std::string model_type;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;  // intermediate size (per expert for MoE)
  int64_t vocab = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_embeddings = false;
  int64_t num_experts = 0;  // MoE only
  int64_t top_k = 0;        // MoE only
  int64_t max_positions = 0;  // 0 = unknown (ALiBi has no hard limit)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

// `source` names the file in messages (e.g. "models/x/config.json").
StatusOr<ModelConfig> parse_model_config(const nlohmann::json& config, const std::string& source);

// Whether a prompt can run on this model: non-empty, every id inside the vocabulary, and
// prompt + max_new_tokens within the context of a rotary model. `who` names the request in
// the message ("prompt 3").
Status check_prompt(const std::vector<int32_t>& prompt, int max_new_tokens, const ModelConfig& config,
                    const std::string& who);

}  // namespace tessera
