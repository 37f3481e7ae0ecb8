#pragma once
// A LoRA adapter as llama.cpp has it: a GGUF file of general.type "adapter" and adapter.type
// "lora" (convert_lora_to_gguf.py), read for a base model of the same architecture. Its
// factors are named after the base's GGUF tensors ("blk.3.attn_q.weight.lora_a" / ".lora_b",
// experts stacked in a third dimension) and shaped as ggml multiplies them; this presents them
// as a PEFT adapter's (worker/lora_adapter.h reads both alike): under
// "base_model.model.<module>.lora_A.weight" / ".lora_B.weight" with the module the base's
// ArchSpec row names in Hugging Face terms, A [r, in], B [out, r], B's rows in the Hugging
// Face order (the converter permuted them as it permutes the base's Q and K and regroups a
// fused QKV). The scale is llama.cpp's: adapter.lora.alpha / r, or 1 where alpha is 0.
//
// Refused naming the key or tensor: a GGUF that is not a LoRA adapter, one for another
// architecture, aLoRA invocation tokens and a task prompt prefix (they change what runs),
// factors of the embedding, the LM head, a router or a norm, a lora_a without its lora_b,
// factors of different ranks, factors that do not fit the base layer's inputs or outputs,
// and anything that is not the factor of a linear layer of the base's blocks.
#include <map>
#include <memory>
#include <string>

#include "common/checkpoint.h"
#include "common/status.h"
#include "worker/lora_adapter.h"
#include "worker/model_config.h"

namespace tessera {

struct GgufLoraAdapter {
  std::shared_ptr<WeightFile> factors;  // PEFT's names and shapes
  LoraAdapterConfig config;             // rank, alpha, every module it holds targeted
};

// `targets`: the base's adaptable layers by PEFT module name (lora_target_modules), whose
// shapes the factors must fit.
StatusOr<GgufLoraAdapter> open_gguf_lora_adapter(const std::string& path, const ModelConfig& base,
                                                 const std::map<std::string, LoraTargetModule>& targets);

}  // namespace tessera
