#pragma once
// Runs one StepPlan on this rank's model and KV cache: copies blocks the plan asks to copy
// (copy-on-write), lays the plan out as one ragged batch, runs the transformer, and samples
// one token for every sequence whose step ends its known tokens.
#include <memory>

#include "common/step_executor.h"
#include "worker/kv_cache.h"
#include "worker/transformer.h"

namespace tessera {

class Executor final : public StepExecutor {
 public:
  // The KV pool holds `num_blocks` blocks of `block_size` tokens, in `kv_dtype`.
  Executor(Transformer& model, Backend& backend, int block_size, int num_blocks, DType kv_dtype = DType::kF32);

  StatusOr<StepResult> execute(const StepPlan& plan) override { return execute(plan, nullptr); }
  // Also hands back the raw logits of the sampled rows ([sampled seqs, vocab], plan order)
  // when `logits` is given — for reference comparisons and --dump-logits.
  StatusOr<StepResult> execute(const StepPlan& plan, std::vector<float>* logits);

  const KvCache& cache() const { return cache_; }

 private:
  Status validate(const StepPlan& plan) const;

  Transformer& model_;
  Backend& backend_;
  KvCache cache_;
};

}  // namespace tessera
