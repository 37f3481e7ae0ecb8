#pragma once
// Runs one StepPlan on this rank's model and KV cache: applies the plan's deltas to the
// sequences' state held here (common/sequence_states.h), copies blocks the plan asks to copy
// (copy-on-write), lays the plan out as one ragged batch, runs the transformer, and samples
// one token for every sequence whose step ends its known tokens (with speculative proposals,
// checks them); with a draft model, the draft then sees the step's committed tokens and
// proposes for the sequences that ask (worker/draft_model.h).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/sequence_states.h"
#include "common/step_executor.h"
#include "worker/draft_model.h"
#include "worker/kv_cache.h"
#include "worker/lora_residency.h"
#include "worker/transformer.h"

namespace tessera {

class Executor final : public StepExecutor {
 public:
  // The KV pool holds `num_blocks` blocks of `block_size` tokens, in `kv_dtype`; a draft
  // model (speculative.method draft) gets a pool of the same blocks beside it.
  Executor(Transformer& model, Backend& backend, int block_size, int num_blocks, DType kv_dtype = DType::kF32,
           Transformer* draft = nullptr, double draft_min_probability = 0.0);

  StatusOr<StepResult> execute(const StepPlan& plan) override { return execute(plan, nullptr); }
  // Also hands back the raw logits of the sampled rows ([sampled seqs, vocab], plan order)
  // when `logits` is given — for reference comparisons and --dump-logits.
  StatusOr<StepResult> execute(const StepPlan& plan, std::vector<float>* logits);

  // The LoRA adapters sequences may name (SeqStart::lora), laid out for this rank's model
  // (shard_lora_adapter). A name already held is replaced; removing one a held sequence
  // still names fails that sequence's next step. With set_max_loras(n > 0) (lora.max_loras)
  // at most n are resident at once; a step brings back the ones its sequences name
  // (worker/lora_residency.h).
  void add_lora(LoraWeights adapter) { loras_.add(std::move(adapter)); }
  bool remove_lora(const std::string& name) { return loras_.remove(name); }
  void set_max_loras(int max_loras) { loras_.set_max_resident(max_loras); }
  // How a plan's lora_loads are read (name, PEFT folder): load_lora_weights against this
  // rank's model. Without one, a plan that loads an adapter fails.
  using LoraLoader = std::function<StatusOr<LoraWeights>(const std::string& name, const std::string& dir)>;
  void set_lora_loader(LoraLoader loader) { lora_loader_ = std::move(loader); }

  const KvCache& cache() const { return cache_; }
  // The sequences whose state this executor holds (until a plan drops them).
  const SequenceStates& sequences() const { return sequences_; }

 private:
  // What the sequence states cannot judge: token ids against the vocabulary, released
  // blocks against the model's window, copies against the pool.
  Status validate(const StepPlan& plan) const;
  // The token(s) of one sampling sequence from its logits rows (`rows`: one, or with
  // proposals num_draft + 1): sampled in turn as if decoded one by one, up to the first sample
  // that is not the next proposal (SeqStep::num_draft).
  std::vector<SampledToken> sample_verifying(const SeqView& v, const float* rows, int64_t vocab) const;
  // What one sampling sequence's step gave: the index of its first sampled token, how many
  // tokens it sampled (accepted proposals + 1), and the last of them.
  struct SampledRun {
    int32_t first_index = 0;
    int32_t count = 0;
    int32_t last = 0;
  };
  // The draft model's share of the step (none without one): every sequence's committed
  // tokens, then proposals where the step asks (SeqStep::propose), into result.proposals.
  Status run_draft(const std::vector<SeqView>& views, const std::unordered_map<SeqId, SampledRun>& sampled,
                   StepResult& result);

  Transformer& model_;
  Backend& backend_;
  KvCache cache_;
  SequenceStates sequences_;
  std::vector<float> host_logits_;  // the step's logits on the host (execute)
  std::unique_ptr<DraftModel> draft_;  // speculative.method draft only
  LoraResidency loras_;
  LoraLoader lora_loader_;
};

}  // namespace tessera
