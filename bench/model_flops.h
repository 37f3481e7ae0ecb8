#pragma once
// Floating-point work of a forward pass, for the compute roofline of tessera-bench: the
// multiply-adds of every linear layer (what the weights say, so every architecture row and
// tensor-parallel shard counts what it really runs) plus attention's query x key products.
#include <cstdint>

#include "worker/model_config.h"
#include "worker/model_weights.h"

namespace tessera {

struct ModelFlops {
  // Multiply-adds per token through the layers' linear weights (MoE: top_k of the experts).
  double layer_macs_per_token = 0;
  // Multiply-adds of the LM head for one row of logits.
  double lm_head_macs_per_row = 0;
  // Multiply-adds of attention per (query, key) pair, summed over layers: Q·K and P·V for
  // each of this rank's query heads.
  double attention_macs_per_pair = 0;
};

ModelFlops model_flops(const ModelWeights& weights, const ModelConfig& config, int64_t q_heads);

// Flops (2 per multiply-add) of one prefill step over `batch` prompts of `prompt_len` tokens
// (logits for the last row of each, as the generator asks for) and of the decode steps that
// follow it: `decode_steps` steps, the s-th (from 1) feeding one token per sequence at
// context prompt_len + s. Causal attention without windows (an upper bound with them).
double prefill_flops(const ModelFlops& f, int64_t batch, int64_t prompt_len);
double decode_flops(const ModelFlops& f, int64_t batch, int64_t prompt_len, int64_t decode_steps);

}  // namespace tessera
