#pragma once
// The clock of one run (seconds since its start, steady) and the rule for issuing its
// next request; shared by the HTTP and ZeroMQ runners.
#include <atomic>
#include <chrono>

#include "tools/loadgen/runner.h"

namespace tessera::loadgen {

class RunClock {
 public:
  RunClock() : start_(std::chrono::steady_clock::now()) {}
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Request `index` may start at time `t` of the run.
inline bool may_issue(const RunPlan& plan, int index, double t, const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load()) return false;
  if (plan.requests > 0 && index >= plan.requests) return false;
  if (plan.duration_s > 0 && t >= plan.duration_s) return false;
  return true;
}

}  // namespace tessera::loadgen
