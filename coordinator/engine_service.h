#pragma once
// The thread-safe face of the engine for the API front ends (HTTP, ZeroMQ clients): one
// background thread owns the Engine and loops schedule -> execute -> events; requests are
// submitted from any thread and their progress comes back through a callback as text deltas
// (incremental, UTF-8-safe detokenization) and token ids, per choice. Stop strings are
// matched here, across token boundaries, and never emitted. The id submit() returns is the
// request's id in the engine too (coordinator/request.h): there is no second id and no map.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/step_executor.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/latency_histogram.h"
#include "coordinator/request.h"
#include "coordinator/scheduler.h"

namespace tessera {

// One callback per new piece of a choice's output, and exactly one per choice with
// finished = true (the request's n choices interleave; the last final event ends it).
struct GenerateEvent {
  int choice = 0;                    // in [0, request.n)
  std::string text;                  // new text since the choice's last event (may be empty)
  std::vector<SampledToken> tokens;  // new tokens since the choice's last event (with logprobs)
  bool finished = false;
  // kStop (eos, stop token, stop string), kLength, kAborted, kError; kNone until finished.
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;                 // when finish_reason == kError
  int prompt_tokens = 0;
  int completion_tokens = 0;         // of this choice, so far
};

using GenerateCallback = std::function<void(const GenerateEvent&)>;

struct EngineServiceOptions {
  SchedulerConfig scheduler;
  int max_queued_requests = 1024;    // submit() beyond this is ResourceExhausted (HTTP 429)
  // Prompt ids must lie in [0, vocab_size) (0 = the tokenizer's vocabulary size when there is
  // one, else unchecked): a bad id would otherwise fail the whole batch's step.
  int64_t vocab_size = 0;
};

// Counters and gauges for /metrics (vLLM-style names are chosen by the HTTP layer).
struct EngineServiceStats {
  uint64_t requests_finished_stop = 0, requests_finished_length = 0, requests_aborted = 0, requests_failed = 0;
  uint64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  int num_running = 0, num_waiting = 0;
  int kv_blocks_total = 0, kv_blocks_free = 0;
  uint64_t prefix_cache_hit_tokens = 0, preemptions = 0;
  uint64_t kv_window_released_blocks = 0;  // given back because a sliding window moved past them
  // Latency histograms (seconds) since start: time to first token, inter-token latency,
  // end-to-end (finished by stop or length).
  LatencyHistogram ttft{ttft_buckets()}, itl{tpot_buckets()}, e2e{e2e_buckets()};
  bool draining = false;
};

class EngineService {
 public:
  // `tokenizer` may be null (no text deltas then, only tokens).
  EngineService(EngineServiceOptions options, StepExecutor& executor, const Tokenizer* tokenizer);
  ~EngineService();  // stop()
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  void start();
  // Stops admitting (submit returns Unavailable), lets running requests finish until
  // `deadline`, aborts the rest, then stops the loop thread.
  void drain_and_stop(std::chrono::milliseconds deadline);
  void stop() { drain_and_stop(std::chrono::milliseconds(0)); }

  // Queues a request and returns its id; the callback runs on the engine thread and must not
  // block. Errors: InvalidArgument (naming the field, from validate_request), ResourceExhausted
  // (queue full), Unavailable (draining).
  StatusOr<RequestId> submit(std::shared_ptr<const Request> request, GenerateCallback callback);
  StatusOr<RequestId> submit(Request request, GenerateCallback callback) {
    return submit(std::make_shared<const Request>(std::move(request)), std::move(callback));
  }
  // Aborts every unfinished choice of a queued or running request (e.g. the client
  // disconnected): its KV blocks are freed at the next loop iteration and each such choice's
  // callback gets finish_reason kAborted. Unknown or finished ids are ignored.
  void abort(RequestId id);

  EngineServiceStats stats() const;
  // Longest prompt + output the scheduler accepts.
  int max_model_len() const;
  // The queue bound (EngineServiceOptions::max_queued_requests): requests submitted and not
  // yet started; a request's choices count once.
  int max_queued_requests() const;
  // Which limit max_model_len() is when it is not scheduler.max_model_len ("the N tokens the
  // whole KV pool holds (...)"); "" when it is.
  std::string max_model_len_limit() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
