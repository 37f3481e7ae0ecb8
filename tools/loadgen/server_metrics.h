#pragma once
// Tessera's own counters (GET /metrics) read before and after each run, so a run's JSON can
// show what the server counted beside what the load generator measured. Other servers
// (no tessera:* series) simply have none.
#include <map>
#include <string>

#include "common/status.h"

namespace tessera::loadgen {

struct ServerCounters {
  bool found = false;  // the text had tessera:* counters
  double prompt_tokens = 0;       // tessera:prompt_tokens_total
  double generation_tokens = 0;   // tessera:generation_tokens_total
  double request_success = 0;     // tessera:request_success_total, all finish reasons
  double request_failure = 0;     // tessera:request_failure_total
  std::map<std::string, double> http_responses;  // tessera:http_responses_total by code
};

// Sums of the series above in Prometheus text format (labels other than `code` summed over).
ServerCounters parse_server_counters(const std::string& prometheus_text);

// GET URL/metrics; Unavailable/InvalidArgument when it cannot be read.
StatusOr<ServerCounters> scrape_server_counters(const std::string& url);

// after - before, as a JSON object text: {"prompt_tokens": n, "generation_tokens": n,
// "request_success": n, "request_failure": n, "http_responses": {"200": n, "429": n}}.
std::string counters_delta_json(const ServerCounters& before, const ServerCounters& after);

}  // namespace tessera::loadgen
