#pragma once
// The thread that does a grammar's costly work the engine's steps could not wait for
// (scheduler.structured_mask_budget_ms): the next mask of a grammar state, computed into the
// grammar's own cache (TokenConstraint::fill_mask), from where the scheduler takes it
// (SequenceConstraint::take_cached_mask); and, for a sequence whose grammar proved costly, the
// step of its grammar by its new token as well (step_constraint), the scheduler applying the
// result. The other sequences' steps go on meanwhile. A job holds the grammar and copies of
// what it reads, never the sequence: a request that ends meanwhile costs only the job's time.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "coordinator/engine/structured/sequence_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"

namespace tessera::structured {

// A job's outcome: `done` is set (release) once it finished; `step` (for a job that stepped
// the grammar by a token) may be read after that. The mask is in the grammar's cache then,
// unless the cache was over its bound and dropped it again (the caller submits it again).
struct WarmResult {
  std::atomic<bool> done{false};
  std::optional<ConstraintStep> step;
};

class MaskWarmer {
 public:
  MaskWarmer() = default;
  ~MaskWarmer();
  MaskWarmer(const MaskWarmer&) = delete;
  MaskWarmer& operator=(const MaskWarmer&) = delete;

  // The mask of `state`, on the warmer's thread (started on first use).
  void submit_mask(std::shared_ptr<const TokenConstraint> grammar, MatchState state,
                   std::shared_ptr<WarmResult> result);
  // The step of `state` by `token`, then (when the grammar goes on) the new state's mask.
  void submit_step(std::shared_ptr<const TokenConstraint> grammar, MatchState state, std::vector<int32_t> end_tokens,
                   int32_t token, std::shared_ptr<WarmResult> result);

 private:
  struct Job {
    std::shared_ptr<const TokenConstraint> grammar;
    MatchState state;
    std::optional<int32_t> token;
    std::vector<int32_t> end_tokens;
    std::shared_ptr<WarmResult> result;
  };
  void push(Job job);
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera::structured
