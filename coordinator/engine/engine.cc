#include "coordinator/engine/engine.h"

#include <chrono>

namespace tessera {

Engine::Engine(SchedulerConfig config, StepExecutor& executor)
    : scheduler_(config), executor_(executor), kv_epoch_(executor.kv_cache_epoch()) {}

Status Engine::add_request(RequestId id, std::shared_ptr<const Request> request) {
  return scheduler_.add_request(id, std::move(request));
}

std::vector<SequenceEvent> Engine::step() {
  if (executor_.kv_cache_epoch() != kv_epoch_) {
    kv_epoch_ = executor_.kv_cache_epoch();
    scheduler_.on_kv_cache_lost();
  }
  last_step_unavailable_ = false;
  // Masks that outran earlier steps' budget go on first: their sequences may rejoin this step.
  std::vector<SequenceEvent> mask_events = scheduler_.advance_deferred_masks();
  StepPlan plan = scheduler_.schedule();
  if (plan.seqs.empty() && plan.block_copies.empty() && plan.lora_loads.empty() && plan.lora_unloads.empty()) {
    last_step_end_.reset();
    return mask_events;
  }
  ++steps_;
  const auto started = std::chrono::steady_clock::now();
  StatusOr<StepResult> result = executor_.execute(plan);
  const auto ended = std::chrono::steady_clock::now();
  if (result.is_ok()) {
    // Back to back with the previous step (work left after it), the time since it ended is
    // what this step's streams waited for their token.
    const double interval =
        last_step_end_ ? std::chrono::duration<double>(ended - *last_step_end_).count() : -1.0;
    const double seconds = std::chrono::duration<double>(ended - started).count();
    scheduler_.on_step_time(plan.step_id, seconds, interval);
    last_step_target_seconds_ = result->target_seconds > 0 ? result->target_seconds : seconds;
  }
  last_step_unavailable_ = !result.is_ok() && result.status().code() == StatusCode::kUnavailable;
  const Status lora_status = result.is_ok() ? Status::ok() : result.status();
  for (const auto& [name, dir] : plan.lora_loads) lora_changes_done_.push_back({name, true, lora_status});
  for (const std::string& name : plan.lora_unloads) lora_changes_done_.push_back({name, false, lora_status});
  if (!result.is_ok()) {
    StepResult failed;
    failed.step_id = plan.step_id;
    failed.error = result.status().to_string();
    last_step_end_.reset();
    std::vector<SequenceEvent> events = scheduler_.on_step_result(plan, failed);
    events.insert(events.begin(), mask_events.begin(), mask_events.end());
    return events;
  }
  std::vector<SequenceEvent> events = scheduler_.on_step_result(plan, result.value());
  events.insert(events.begin(), mask_events.begin(), mask_events.end());
  // Idle time before the next step is not a wait of any stream.
  if (scheduler_.has_work()) {
    last_step_end_ = ended;
  } else {
    last_step_end_.reset();
  }
  return events;
}

}  // namespace tessera
