#pragma once
// What the load generator measured for one request: the times of its events (seconds since
// the start of its run, on the steady clock), its token counts and how it ended. The runners
// fill these in; stats.h turns a run's records into percentiles and rates.
#include <string>
#include <vector>

namespace tessera::loadgen {

struct RequestRecord {
  int index = 0;           // position in the workload (request i of the run)
  double scheduled_s = 0;  // when the arrival process said it should start
  double sent_s = 0;       // when it was handed to the transport (latencies start here)
  double end_s = 0;        // when its last event (or its error) arrived
  // Times of the events that carried output tokens (content chunks, ZeroMQ deltas); the
  // first one is the first token. Empty when the server sent no per-token events.
  std::vector<double> token_times_s;
  int input_tokens = 0;   // prompt tokens (the server's usage when it reports it)
  int output_tokens = 0;  // generated tokens (usage when reported, else counted from the stream)
  bool ok = false;
  std::string error_kind;  // when !ok: http_429, connect, timeout, ... (docs/benchmarks.md)
  std::string error_message;

  // Derived latencies (seconds); only meaningful when ok.
  bool has_first_token() const { return !token_times_s.empty(); }
  double ttft_s() const { return token_times_s.front() - sent_s; }
  double e2e_s() const { return end_s - sent_s; }
  // (e2e - ttft) / (output_tokens - 1); only for output_tokens > 1 and a first token.
  bool has_tpot() const { return has_first_token() && output_tokens > 1; }
  double tpot_s() const { return (e2e_s() - ttft_s()) / (output_tokens - 1); }
};

}  // namespace tessera::loadgen
