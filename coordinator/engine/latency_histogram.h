#pragma once
// A fixed-bucket latency histogram (seconds): what /metrics exposes, kept as counts so a
// long-running server's memory does not grow with the number of requests served.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace tessera {

class LatencyHistogram {
 public:
  LatencyHistogram() = default;
  explicit LatencyHistogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

  void observe(double seconds) {
    const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
    ++counts_[i];
    sum_ += seconds;
    ++count_;
  }
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (Prometheus' cumulative "le" buckets).
  uint64_t cumulative(size_t i) const {
    uint64_t n = 0;
    for (size_t k = 0; k <= i && k < counts_.size(); ++k) n += counts_[k];
    return n;
  }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket; the last one is (last bound, +Inf)
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Bucket upper bounds (seconds) of the latency histograms (vLLM's choices): time to first
// token, inter-token latency, end-to-end latency, and the request's queue/prefill/decode phases.
const std::vector<double>& ttft_buckets();
const std::vector<double>& tpot_buckets();
const std::vector<double>& e2e_buckets();
const std::vector<double>& request_phase_buckets();

}  // namespace tessera
