#pragma once
// When the requests of an open-loop run start: Poisson arrivals (exponential gaps) or a
// constant rate, optionally in bursts of B requests that arrive together (the bursts then
// come at rate / B, so the mean request rate stays `rate`). The first arrival is at t = 0;
// gap k depends only on (seed, k). Closed-loop runs (N users, each sending its next request
// when the last one ends) have no schedule.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::loadgen {

enum class ArrivalKind { kPoisson, kConstant };

struct ArrivalOptions {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double rate = 1;  // requests per second (mean), > 0
  int burst = 1;    // requests arriving together
  uint64_t seed = 0;
};
StatusOr<ArrivalKind> parse_arrival_kind(const std::string& text);
// "poisson", "constant", "poisson-burst8", ...: how a run's JSON names its arrival process.
std::string arrival_name(const ArrivalOptions& options);

// Arrival times in seconds from the start of the run, in order.
class ArrivalSchedule {
 public:
  explicit ArrivalSchedule(ArrivalOptions options) : options_(options) {}
  // The time of the next request (0 for the first).
  double next();

 private:
  ArrivalOptions options_;
  int64_t issued_ = 0;  // requests handed out
  double group_time_ = 0;
};

// The first `count` arrival times.
std::vector<double> arrival_times(const ArrivalOptions& options, int count);

}  // namespace tessera::loadgen
