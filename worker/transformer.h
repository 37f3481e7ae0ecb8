#pragma once
// One transformer, any architecture in the ArchSpec table: embedding, N blocks (norm ->
// attention -> residual, norm -> MLP/MoE -> residual; or both branches from the same
// residual in a parallel block; Gemma's extra norms on the branch outputs), final norm,
// LM head.
// forward() runs one ragged batch of new tokens (prefill chunks and decode tokens mixed)
// against the paged KV cache and returns logits for the rows asked for.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/communicator.h"
#include "common/huge_pages.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/kv_cache.h"
#include "worker/lora_weights.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/staged_weights.h"
#include "worker/weight_residency.h"

namespace tessera {

struct ModelLoadOptions {
  DType dtype = DType::kF32;
  bool kernel_inject = true;
  // Tensor parallelism: this rank's communicator (nullptr = world of 1) and the TP plan
  // (nullptr = split everything that can be split).
  Communicator* comm = nullptr;
  const TpPlan* plan = nullptr;
  QuantizationOptions quant;  // int8 weight-only (docs/quantization.md); none by default
  // model.check_weights: refuse NaN/Inf weights; nullopt = auto (checkpoints up to
  // kCheckWeightsAutoBytes).
  std::optional<bool> check_weights;
  bool lm_head = true;  // false: no LM head (server.task embed; forward() then gives no logits)
  // The longest sequence served (scheduler.max_model_len); 0 = the model's own context.
  // LongRoPE picks its factors by it (ModelConfig::served_context).
  int64_t max_context = 0;
  // model.weights_memory_budget and friends: the layers beyond the budget are streamed
  // (the CPU: worker/weight_residency.h; a device: worker/staged_weights.h).
  WeightResidencyOptions residency;
  // On the CPU backend, when the resident weights go onto 2 MiB pages (common/huge_pages.h;
  // kAuto is taken as kLoad here: the tools that serve resolve it before).
  WeightHugePages huge_pages = WeightHugePages::kLoad;
  std::string log_prefix = "weights";  // who the huge-page mover's log line names ("rank 0/2")
};

class Transformer {
 public:
  // `path`: a Hugging Face folder or a DeepSpeed checkpoint JSON. With a communicator of
  // world size N, loads only this rank's slices and runs in lock-step with the other ranks.
  static StatusOr<std::unique_ptr<Transformer>> load(const std::string& path,
                                                     const ModelLoadOptions& options, Backend& backend);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& config_dir() const { return config_dir_; }
  bool kernel_inject() const { return kernel_inject_; }
  // Storage type of the weights; the KV cache uses it too unless told otherwise.
  DType dtype() const { return dtype_; }
  // The shape this rank's KV cache needs: the model's config with the local KV heads.
  ModelConfig cache_config() const;
  const ShardSpec& shard() const { return shard_; }
  // The weight streaming plan and accounting; null when every weight is resident.
  const WeightResidency* residency() const { return residency_.get(); }
  // The same on a device backend: the units streamed from host memory into device slots.
  const StagedWeights* staged() const { return staged_.get(); }
  // The start-up plan of the weights streamed (either way), or "" when all are resident.
  std::string streaming_plan() const;
  // What moves the resident weights onto 2 MiB pages after start (model.weights_huge_pages
  // after_start on the CPU backend); null otherwise.
  const HugePageMover* huge_page_mover() const { return huge_page_mover_.get(); }

  // tokens: the new tokens of all sequences, grouped per sequence as batch.query_start says.
  // Writes their K/V into `cache`, and fills `logits` [logit_rows.size(), vocab] with the
  // logits of the given token rows (typically the last new token of each sequence).
  // Every rank of a tensor-parallel group must call it with the same arguments; every
  // rank gets the full logits. Fails (Unavailable) only when a collective failed — a peer
  // rank is gone — and from then on always: the group is broken and must be rebuilt.
  // `hidden_rows` / `hidden` [hidden_rows.size(), hidden]: rows whose final hidden states
  // (after the final norm, before the LM head) are wanted too — embedding sequences.
  // `seq_adapters` [batch.num_seqs()] (or empty: none): the LoRA adapter each sequence runs
  // with (nullptr: the base alone), shard_lora_adapter'd for this model's weights.
  Status forward(const std::vector<int32_t>& tokens, const AttentionBatch& batch, KvCache& cache,
                 const std::vector<int32_t>& logit_rows, const TensorView& logits,
                 const std::vector<int32_t>& hidden_rows = {}, const TensorView* hidden = nullptr,
                 const std::vector<const LoraWeights*>& seq_adapters = {});

 private:
  Transformer(ModelConfig config, ModelWeights weights, std::string config_dir, bool kernel_inject,
              DType dtype, ShardSpec shard, std::unique_ptr<Communicator> owned_comm, Communicator* comm,
              Backend& backend);
  // Sums a row-parallel group's partial output over the ranks (a no-op for one rank).
  void all_reduce(const TensorView& partial);
  void lm_head(const TensorView& normed, const TensorView& logits);
  // Rows [begin, end) of a projection's input run with `adapter`.
  struct LoraRun {
    int64_t begin = 0, end = 0;
    const LoraWeights* adapter = nullptr;
  };
  using LoraRuns = std::vector<LoraRun>;
  // The runs of the rows of this step's tokens listed in `rows` (in order), or of every token.
  LoraRuns lora_runs(const std::vector<int32_t>* rows = nullptr) const;
  // out = act(x · w^T + b) for any storage of w: f32/f16/bf16, or int8 with its scales; plus,
  // for the rows of `lora`'s runs, their adapter's update of w (before the activation).
  void project(const LinearWeights& w, const TensorView& x, const TensorView& out,
               Activation act = Activation::kNone, const LoraRuns& lora = {});
  void add_lora(const LinearWeights& w, const TensorView& x, const TensorView& out, const LoraRuns& lora);
  // The sub-blocks write their output to `delta`. With `defer_reduce` a split group's
  // output is left as this rank's partial sum (the caller reduces it together with the
  // other branch of a parallel block); the return value says whether it was.
  bool attention_block(int layer, const TensorView& h, const std::vector<int32_t>& positions,
                       const AttentionBatch& batch, KvCache& cache, const TensorView& delta, bool defer_reduce);
  bool mlp_block(int layer, const TensorView& h, const TensorView& delta, bool defer_reduce);
  // One dense or gated MLP (or expert): out = down(act(...)); `lora`: h's rows' adapters.
  void mlp(const MlpWeights& w, const TensorView& h, const TensorView& out, const LoraRuns& lora);
  void moe_block(const LayerWeights& lw, const TensorView& h, const TensorView& delta);
  // residual += delta (when given), then out = norm(residual) with this norm's weights.
  void add_and_norm(const TensorView& residual, const TensorView* delta, const Tensor& w,
                    const Tensor& b, const TensorView& out);
  // One layer: the residual stream x gets the previous layer's pending output added and
  // leaves this layer's in `delta` (added by the next layer's fused norm).
  void layer_forward(int layer, const TensorView& x, const TensorView* pending, const TensorView& h,
                     const TensorView& delta, const TensorView& delta2, const std::vector<int32_t>& positions,
                     const AttentionBatch& batch, KvCache& cache);
  // A sub-block's output before the residual add, times residual_scale (Granite, MiniCPM).
  void scale_residual(const TensorView& delta);

  ModelConfig config_;
  ModelWeights weights_;
  std::string config_dir_;
  bool kernel_inject_;
  DType dtype_;
  ShardSpec shard_;
  std::unique_ptr<Communicator> owned_comm_;  // the loopback one when none was given
  Communicator* comm_;
  Backend& backend_;
  // Heads this rank's attention computes: its shard, or all when the plan keeps attention whole.
  int64_t q_heads_ = 0, kv_heads_ = 0;
  GqaLayout gqa_;  // which local KV head each local query head reads
  Tensor alibi_slopes_;  // [q_heads_] for ALiBi architectures, by global head index
  std::vector<Tensor> rope_tables_;  // distinct inverse-frequency tables (Gemma 3 has two)
  std::vector<int> layer_rope_;      // index into rope_tables_ per layer
  std::vector<float> layer_rope_magnitude_;  // cos/sin scale per layer (LongRoPE's attention factor)
  float embed_scale_ = 1.0f;         // config's embed_scale (rounded to the weight dtype where it says so)
  Status comm_error_;    // the first failed collective; sticky
  // This forward's adapter per token row (empty: none in the step), and its runs.
  std::vector<const LoraWeights*> token_adapters_;
  LoraRuns token_runs_;
  std::unique_ptr<WeightResidency> residency_;  // streams the layers beyond the budget (CPU)
  std::unique_ptr<StagedWeights> staged_;       // the same into device slots
  // Moves the resident weights onto 2 MiB pages after start (model.weights_huge_pages
  // after_start); null otherwise.
  std::unique_ptr<HugePageMover> huge_page_mover_;
};

// BLOOM's ALiBi slopes for `heads` heads, including the interleaved second series used when
// heads is not a power of two.
std::vector<float> alibi_slopes(int64_t heads);

}  // namespace tessera
