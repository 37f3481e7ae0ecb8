#pragma once
// The in-process engine loop: requests in, one step at a time through the scheduler and an
// executor, events out. The HTTP and ZeroMQ front ends (and tessera-generate) drive it; the
// executor is whatever runs the model (in-process, or the dispatcher to worker processes).
// Not thread-safe: one thread owns the engine and calls add_request / abort / step.
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/step_executor.h"
#include "coordinator/scheduler.h"

namespace tessera {

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 16;
  StopConditions stop;
  int priority = 0;
};

class Engine {
 public:
  Engine(SchedulerConfig config, StepExecutor& executor);

  // Queues a request and returns its id; an invalid request is an error naming it.
  StatusOr<SeqId> add_request(EngineRequest request);
  // Cancels a queued or running request; false when it is unknown or already finished.
  bool abort(SeqId id);
  // Runs one step. An executor failure ends that step's sequences with kError (reported in
  // the events) and the engine carries on with the rest.
  std::vector<SequenceEvent> step();
  bool has_work() const { return scheduler_.has_work(); }

  const Scheduler& scheduler() const { return scheduler_; }
  uint64_t steps() const { return steps_; }

 private:
  Scheduler scheduler_;
  StepExecutor& executor_;
  SeqId next_id_ = 1;
  uint64_t steps_ = 0;
  uint64_t kv_epoch_ = 0;
};

}  // namespace tessera
