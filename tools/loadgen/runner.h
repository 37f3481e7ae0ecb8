#pragma once
// Issues a run's requests and timestamps every event: over HTTP (POST with
// "stream": true, one thread per request in flight, each with its own keep-alive
// connection) or over Tessera's ZeroMQ client API (one connection and one thread carry all
// requests). Open loop (an arrival schedule) or closed loop (N users).
//
// Bounded: a run issues no request after `requests` requests or after `duration_s`, and a
// request running longer than `request_timeout_s` (or silent that long) is ended (HTTP: the
// connection is closed; ZeroMQ: an Abort is sent) as a `timeout` error.
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/openai_request.h"
#include "tools/loadgen/record.h"
#include "tools/loadgen/workload.h"

namespace tessera::loadgen {

struct TargetOptions {
  std::string url;  // http://HOST:PORT (used when zmq is empty)
  std::string zmq;  // ZeroMQ client endpoint; when set, requests go there
  std::string api_key;
  std::string curve_server_public_key;  // ZeroMQ: the server's CURVE key (Z85); "" = plain
  RequestFormat format;
  double request_timeout_s = 300;
  int max_inflight = 256;  // HTTP: most requests in flight (threads); later arrivals wait
};

struct RunPlan {
  int requests = 0;        // requests to issue; 0 = until duration_s
  double duration_s = 0;   // issue no request after this; 0 = no limit
  std::optional<ArrivalOptions> arrivals;  // open loop
  int concurrency = 0;     // closed loop: users (when no arrivals)
};

// Live counters for the progress bar.
struct Progress {
  std::atomic<int> issued{0}, ok{0}, failed{0};
  std::atomic<long long> output_tokens{0};
  void reset() {
    issued = 0;
    ok = 0;
    failed = 0;
    output_tokens = 0;
  }
};

struct RunOutput {
  std::vector<RequestRecord> records;  // by index
  double duration_s = 0;               // from the first arrival to the end of the last request
};

// `stop`, when set (e.g. by SIGINT), ends issuing and cancels requests in flight
// (error kind `cancelled`).
StatusOr<RunOutput> run_load(const TargetOptions& target, const Workload& workload, const RunPlan& plan,
                             Progress* progress, const std::atomic<bool>* stop);

// The error kind of a transport failure message (connect, timeout, disconnected, transport).
std::string transport_error_kind(const std::string& message);

}  // namespace tessera::loadgen
