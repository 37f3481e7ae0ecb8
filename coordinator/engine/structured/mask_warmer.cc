#include "coordinator/engine/structured/mask_warmer.h"

#include "common/thread_priority.h"

namespace tessera::structured {

MaskWarmer::~MaskWarmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MaskWarmer::submit_mask(std::shared_ptr<const TokenConstraint> grammar, MatchState state,
                             std::shared_ptr<WarmResult> result) {
  push(Job{std::move(grammar), std::move(state), std::nullopt, {}, std::move(result)});
}

void MaskWarmer::submit_step(std::shared_ptr<const TokenConstraint> grammar, MatchState state,
                             std::vector<int32_t> end_tokens, int32_t token, std::shared_ptr<WarmResult> result) {
  push(Job{std::move(grammar), std::move(state), token, std::move(end_tokens), std::move(result)});
}

void MaskWarmer::push(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_one();
}

void MaskWarmer::run() {
  lower_this_thread_priority();  // the steps' own work goes first
  std::vector<uint32_t> mask;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const MatchState* masked = &job.state;
    if (job.token) {
      job.result->step = step_constraint(*job.grammar, job.state, job.end_tokens, *job.token);
      masked = job.result->step->verdict == ConstraintVerdict::kContinue ? &job.result->step->next : nullptr;
    }
    if (masked != nullptr) job.grammar->fill_mask(*masked, &mask);
    job.result->done.store(true, std::memory_order_release);
  }
}

}  // namespace tessera::structured
