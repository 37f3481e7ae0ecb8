#pragma once
// The weights of one model (one tensor-parallel rank, later), laid out for the transformer
// block: packed QKV and gate|up matrices on the fused ("kernel_inject") path, separate
// matrices on the plain path. BLOOM's per-head interleaved QKV is reordered to
// [q heads | k heads | v heads] at load so both paths read one layout.
#include <vector>

#include "common/checkpoint.h"
#include "common/status.h"
#include "common/tensor.h"
#include "worker/model_config.h"

namespace tessera {

struct LinearWeights {
  Tensor w;  // [out, in]
  Tensor b;  // [out] or empty
};

struct ExpertWeights {
  LinearWeights gate, up, gate_up, down;  // gate_up only on the fused path
};

struct LayerWeights {
  Tensor attn_norm_w, attn_norm_b, mlp_norm_w, mlp_norm_b;  // *_b empty for RMSNorm
  LinearWeights q, k, v;  // plain path (views of a reordered qkv for BLOOM)
  LinearWeights qkv;      // fused path: [(heads + 2 * kv_heads) * head_dim, hidden]
  LinearWeights o;
  LinearWeights gate, up, gate_up, down;  // dense MLPs; gate_up on the fused path
  LinearWeights router;                   // MoE
  std::vector<ExpertWeights> experts;     // MoE
};

struct ModelWeights {
  Tensor embed;
  Tensor embed_norm_w, embed_norm_b;
  Tensor final_norm_w, final_norm_b;
  LinearWeights lm_head;  // a view of `embed` when tied
  std::vector<LayerWeights> layers;
  // Bytes of weights one decode step streams at batch 1 (every layer, the final norm and
  // the LM head; one embedding row is negligible; MoE counts top_k of the experts).
  int64_t decode_bytes_per_token = 0;
  int64_t total_bytes = 0;
};

struct WeightLoadOptions {
  DType dtype = DType::kF32;  // storage type of the weights
  bool kernel_inject = true;  // pack QKV and gate|up for the fused ops
};

StatusOr<ModelWeights> load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                          const WeightLoadOptions& options);

}  // namespace tessera
