#pragma once
// A StepExecutor that passes every plan to a real one and counts the tokens the plans feed:
// for tests that check how much prompt work a scheduler path really did.
#include <cstdint>

#include "common/step_executor.h"

namespace tessera::testing {

class FeedCountingExecutor final : public StepExecutor {
 public:
  explicit FeedCountingExecutor(StepExecutor& inner) : inner_(inner) {}
  StatusOr<StepResult> execute(const StepPlan& plan) override {
    for (const SeqStep& s : plan.seqs) fed_ += static_cast<int64_t>(s.tokens.size());
    return inner_.execute(plan);
  }
  uint64_t kv_cache_epoch() const override { return inner_.kv_cache_epoch(); }
  int64_t fed() const { return fed_; }

 private:
  StepExecutor& inner_;
  int64_t fed_ = 0;
};

}  // namespace tessera::testing
