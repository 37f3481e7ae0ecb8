#pragma once
// Prometheus text exposition (format 0.0.4) of the engine's counters, gauges and latency
// histograms: the series vLLM exports, under their own "vllm:" names and counted as vLLM
// counts them (per request, whatever its n), so dashboards and autoscalers written for vLLM
// work unchanged; and Tessera's own "tessera:" series (some per sequence, see docs/api.md).
// Every series carries model_name="...".
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/engine/engine_service.h"

namespace tessera {

// One histogram's series ("<name>_bucket{le=...}", "_sum", "_count").
std::string render_histogram(const std::string& name, const std::string& help, const std::string& labels,
                             const LatencyHistogram& histogram);

// The "vllm:" series; `labels` is the label list every sample carries (model_name="...").
std::string render_vllm_series(const EngineServiceStats& stats, const std::string& labels);

// Replies sent by a front end, by status code (HTTP's, or the status a ZeroMQ Error carries;
// a ZeroMQ Final counts as 200). Thread-safe; shared between the front end that counts and
// the page that shows them, so neither outlives the other's data.
class ReplyCounter {
 public:
  void add(int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[status];
  }
  std::map<int, uint64_t> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> counts_;
};

// The whole /metrics page for the engine. `http_responses` (status code -> count) adds
// tessera:http_responses_total{code="..."}, `zmq_replies` tessera:zmq_replies_total{code="..."};
// pass {} to leave either out.
std::string render_metrics(const EngineServiceStats& stats, const std::string& model_name,
                           const std::map<int, uint64_t>& http_responses = {},
                           const std::map<int, uint64_t>& zmq_replies = {});

}  // namespace tessera
