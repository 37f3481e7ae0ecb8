#pragma once
// One transformer, any architecture in the ArchSpec table: embedding, N identical blocks
// (norm -> attention -> residual, norm -> MLP/MoE -> residual), final norm, LM head.
// forward() runs one ragged batch of new tokens (prefill chunks and decode tokens mixed)
// against the paged KV cache and returns logits for the rows asked for.
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/kv_cache.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"

namespace tessera {

struct ModelLoadOptions {
  DType dtype = DType::kF32;
  bool kernel_inject = true;
};

class Transformer {
 public:
  // `path`: a Hugging Face folder or a DeepSpeed checkpoint JSON.
  static StatusOr<std::unique_ptr<Transformer>> load(const std::string& path,
                                                     const ModelLoadOptions& options, Backend& backend);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& config_dir() const { return config_dir_; }
  bool kernel_inject() const { return kernel_inject_; }
  // Storage type of the weights; the KV cache uses it too unless told otherwise.
  DType dtype() const { return dtype_; }

  // tokens: the new tokens of all sequences, grouped per sequence as batch.query_start says.
  // Writes their K/V into `cache`, and fills `logits` [logit_rows.size(), vocab] with the
  // logits of the given token rows (typically the last new token of each sequence).
  void forward(const std::vector<int32_t>& tokens, const AttentionBatch& batch, KvCache& cache,
               const std::vector<int32_t>& logit_rows, const TensorView& logits);

 private:
  Transformer(ModelConfig config, ModelWeights weights, std::string config_dir, bool kernel_inject,
              DType dtype, Backend& backend);
  void attention_block(int layer, const TensorView& h, const std::vector<int32_t>& positions,
                       const AttentionBatch& batch, KvCache& cache, const TensorView& delta);
  void mlp_block(int layer, const TensorView& h, const TensorView& delta);
  void swiglu(const LinearWeights& gate, const LinearWeights& up, const LinearWeights& gate_up,
              const LinearWeights& down, const TensorView& h, const TensorView& out);
  void moe_block(const LayerWeights& lw, const TensorView& h, const TensorView& delta);
  // residual += delta (when given), then out = norm(residual) with this norm's weights.
  void add_and_norm(const TensorView& residual, const TensorView* delta, const Tensor& w,
                    const Tensor& b, const TensorView& out);

  ModelConfig config_;
  ModelWeights weights_;
  std::string config_dir_;
  bool kernel_inject_;
  DType dtype_;
  Backend& backend_;
  Tensor alibi_slopes_;  // [heads] for ALiBi architectures
};

// BLOOM's ALiBi slopes for `heads` heads, including the interleaved second series used when
// heads is not a power of two.
std::vector<float> alibi_slopes(int64_t heads);

}  // namespace tessera
