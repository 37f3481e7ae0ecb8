#pragma once
// Statistics of one load-generator run: latency percentiles, throughput, goodput under SLOs
// and errors by kind, from the per-request records.
//
// Percentiles use linear interpolation between the closest ranks (numpy's default,
// "linear"): for n sorted samples x[0..n-1] and q in [0, 100], h = (n - 1) * q / 100 and
// p(q) = x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]). p(100) is the max.
//
// Rates divide by the run's duration: from its start (the first arrival) to the end of its
// last request.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadgen/record.h"

namespace tessera::loadgen {

// Latency objectives a request must meet to count towards goodput; absent = not checked.
struct Slo {
  std::optional<double> ttft_s;  // time to first token
  std::optional<double> tpot_s;  // time per output token after the first
  std::optional<double> itl_s;   // every gap between token events
  std::optional<double> e2e_s;   // whole request
  bool empty() const { return !ttft_s && !tpot_s && !itl_s && !e2e_s; }
};
// "ttft=500ms,tpot=50ms", "ttft=0.5,e2e=10s": keys ttft, tpot, itl, e2e; values in seconds,
// or with a unit s / ms / us. InvalidArgument naming the bad part.
StatusOr<Slo> parse_slo(const std::string& text);
// A completed request meets every objective given. A request with one output token has no
// TPOT and no gaps, so it meets those objectives; one without token events meets none.
bool meets_slo(const RequestRecord& r, const Slo& slo);

// q in [0, 100] of `sorted` (ascending, not empty), as above.
double percentile(const std::vector<double>& sorted, double q);

struct Summary {
  size_t count = 0;  // samples; the values below are NaN (null in JSON) when 0
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};
Summary summarize(std::vector<double> values);

struct RunStats {
  double rate = 0;                 // offered rate (requests/s); for closed loop the achieved rate
  std::optional<int> concurrency;  // closed loop: the number of users
  std::string arrival;             // poisson | constant | burst | closed
  int issued = 0;                  // requests sent
  int completed = 0;               // finished successfully
  int failed = 0;                  // issued - completed
  std::map<std::string, int> errors;  // failed requests by kind
  std::map<std::string, std::string> error_examples;  // the first failure's message, by kind
  double duration_s = 0;
  long long input_tokens = 0;   // of completed requests
  long long output_tokens = 0;  // of completed requests
  long long failed_output_tokens = 0;  // streamed by requests that then failed (aborted, cut off)
  int slo_met = 0;               // completed requests that met every SLO
  double requests_per_s = 0;     // completed / duration
  double input_tokens_per_s = 0;
  double output_tokens_per_s = 0;
  double goodput_requests_per_s = 0;  // slo_met / duration (= requests_per_s without SLOs)
  Summary ttft, tpot, itl, e2e;       // seconds, completed requests only; itl = every gap
  int no_token_events = 0;            // completed requests whose stream carried no token event
};

// `duration_s` is the run's wall time (start to last request's end).
RunStats compute_stats(const std::vector<RequestRecord>& records, const Slo& slo, double duration_s);

// Throughput of a sweep at a p99-TTFT objective: the highest throughput among its runs
// whose p99 TTFT is within `ttft_slo_s`, where the next run by rate misses it: linearly
// interpolated between the two runs at the point where p99 TTFT crosses the objective.
struct SloThroughput {
  bool found = false;  // some run met the objective
  double rate = 0, requests_per_s = 0, output_tokens_per_s = 0;
};
SloThroughput throughput_at_p99_ttft(std::vector<RunStats> runs, double ttft_slo_s);

}  // namespace tessera::loadgen
