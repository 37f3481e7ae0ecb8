#pragma once
// Reproducible random numbers for the load generator: a counter-based stream per
// (seed, purpose, index), so request i of a workload is the same whatever the request
// count, and the same on every platform (no std:: distributions, whose output the standard
// leaves to the library).
#include <cmath>
#include <cstdint>

#include "common/splitmix64.h"

namespace tessera::loadgen {

using tessera::splitmix64;

class Random {
 public:
  Random(uint64_t seed, uint64_t stream, uint64_t index)
      : state_(splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index)) {}
  uint64_t next() { return splitmix64(state_++); }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi].
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(next() % span);
  }
  // Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  // Exponential with mean 1.
  double exponential() { return -std::log(1.0 - uniform()); }

 private:
  uint64_t state_;
};

// Purposes, so the arrival times do not change when the lengths' distribution does.
enum : uint64_t { kStreamInputLen = 1, kStreamOutputLen = 2, kStreamPrompt = 3, kStreamArrival = 4 };

}  // namespace tessera::loadgen
