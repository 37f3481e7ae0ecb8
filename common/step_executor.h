#pragma once
// What the engine loop needs from whoever runs the model: execute one StepPlan, return its
// StepResult. In-process this is the worker's executor; across processes, the ZeroMQ
// dispatcher that fans the plan out to every rank.
#include "common/status.h"
#include "common/step_plan.h"

namespace tessera {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual StatusOr<StepResult> execute(const StepPlan& plan) = 0;
  // Identifies the executors' KV caches: it changes when they were recreated (workers
  // restarted), which tells the scheduler that no cached KV may be reused.
  virtual uint64_t kv_cache_epoch() const { return 0; }
};

}  // namespace tessera
