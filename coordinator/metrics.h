#pragma once
// Prometheus text exposition (format 0.0.4) of the engine's counters, gauges and latency
// histograms, with vLLM's metric names under a "tessera:" prefix so vLLM dashboards work
// after a prefix rename. Every series carries model_name="...".
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coordinator/engine_service.h"

namespace tessera {

// One histogram's series ("<name>_bucket{le=...}", "_sum", "_count").
std::string render_histogram(const std::string& name, const std::string& help, const std::string& labels,
                             const LatencyHistogram& histogram);

// The whole /metrics page for the engine. `http_responses` (status code -> count) adds
// tessera:http_responses_total{code="..."}; pass {} to leave it out.
std::string render_metrics(const EngineServiceStats& stats, const std::string& model_name,
                           const std::map<int, uint64_t>& http_responses = {});

}  // namespace tessera
