#pragma once
// The in-process engine loop: requests in, one step at a time through the scheduler and an
// executor, events out. The HTTP and ZeroMQ front ends (and tessera-generate) drive it; the
// executor is whatever runs the model (in-process, or the dispatcher to worker processes).
// Not thread-safe: one thread owns the engine and calls add_request / abort / step.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/step_executor.h"
#include "coordinator/engine/request.h"
#include "coordinator/engine/scheduler.h"

namespace tessera {

class Engine {
 public:
  Engine(SchedulerConfig config, StepExecutor& executor);

  // Queues a request under the caller's id (unique among live requests, in [1,
  // kMaxRequestId]); an invalid request is an error naming it. Its events carry
  // choice_seq_id(id, choice) as seq_id.
  Status add_request(RequestId id, std::shared_ptr<const Request> request);
  // Cancels every choice of a queued or running request; false when none is live.
  bool abort(RequestId id) { return scheduler_.abort(id); }
  // Cancels one choice; the request's other choices go on.
  bool abort_choice(RequestId id, int choice) { return scheduler_.abort_choice(id, choice); }
  // Runs one step. An executor failure ends that step's sequences with kError (reported in
  // the events) and the engine carries on with the rest.
  std::vector<SequenceEvent> step();
  bool has_work() const { return scheduler_.has_work() || scheduler_.has_lora_changes(); }
  // LoRA adapters loaded and dropped while serving (Scheduler::add_lora_load, add_lora_unload),
  // and what became of those the steps since the last call carried: each name with the
  // step's status (an executor that failed the step failed them too).
  void add_lora_load(const std::string& name, const std::string& dir) { scheduler_.add_lora_load(name, dir); }
  void add_lora_unload(const std::string& name) { scheduler_.add_lora_unload(name); }
  struct LoraChangeDone {
    std::string name;
    bool load = true;  // false: an unload
    Status status;
  };
  std::vector<LoraChangeDone> take_lora_changes_done() { return std::exchange(lora_changes_done_, {}); }
  // Whether the last step() failed because the executor was unavailable (a worker rank lost
  // or missing, StatusCode::kUnavailable): its kError events are then worth retrying.
  bool last_step_unavailable() const { return last_step_unavailable_; }

  const Scheduler& scheduler() const { return scheduler_; }
  uint64_t steps() const { return steps_; }
  // What the last step that ran cost the executor's target model (StepResult::target_seconds;
  // the step's whole time where the executor did not say); 0 before any.
  double last_step_target_seconds() const { return last_step_target_seconds_; }

 private:
  Scheduler scheduler_;
  StepExecutor& executor_;
  uint64_t steps_ = 0;
  uint64_t kv_epoch_ = 0;
  bool last_step_unavailable_ = false;
  double last_step_target_seconds_ = 0;
  // When the last step ended, while work was left after it (Scheduler::on_step_time's interval).
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
  std::vector<LoraChangeDone> lora_changes_done_;
};

}  // namespace tessera
