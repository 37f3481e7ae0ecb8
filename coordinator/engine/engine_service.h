#pragma once
// The thread-safe face of the engine for the API front ends (HTTP, ZeroMQ clients): one
// background thread owns the Engine and loops schedule -> execute -> events; requests are
// submitted from any thread and their progress comes back through a callback as text deltas
// (incremental, UTF-8-safe detokenization) and token ids, per choice. Stop strings are
// matched here, across token boundaries, and never emitted. The id submit() returns is the
// request's id in the engine too (coordinator/engine/request.h): there is no second id and no map.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/step_executor.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/latency_histogram.h"
#include "coordinator/engine/request.h"
#include "coordinator/engine/scheduler.h"

namespace tessera {

// One callback per new piece of a choice's output, and exactly one per choice with
// finished = true (the request's n choices interleave; the last final event ends it).
struct GenerateEvent {
  int choice = 0;                    // in [0, request.n)
  std::string text;                  // new text since the choice's last event (may be empty)
  std::vector<SampledToken> tokens;  // new tokens since the choice's last event (with logprobs)
  // A request asking prompt logprobs (sampling.prompt_logprobs >= 0): on each choice's first
  // event, the logprob of every prompt token from position 1 on (position order); else empty.
  std::vector<PromptLogprob> prompt_logprobs;
  bool finished = false;
  // kStop (eos, stop token, stop string), kLength, kAborted, kError; kNone until finished.
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;                 // when finish_reason == kError
  // With kError: the workers could not run it (a rank lost, the group restarting), not the
  // request's fault; the client may retry (HTTP 503 with Retry-After).
  bool unavailable = false;
  int prompt_tokens = 0;
  int completion_tokens = 0;         // of this choice, so far
  // An embedding request's (Request::pooling) one event: the pooled vector, not normalised.
  std::vector<float> embedding;
};

using GenerateCallback = std::function<void(const GenerateEvent&)>;

struct EngineServiceOptions {
  SchedulerConfig scheduler;
  int max_queued_requests = 1024;    // submit() beyond this is ResourceExhausted (HTTP 429)
  // Prompt ids must lie in [0, vocab_size) (0 = the tokenizer's vocabulary size when there is
  // one, else unchecked): a bad id would otherwise fail the whole batch's step.
  int64_t vocab_size = 0;
  // Whether the executor can run a step now (the worker group is whole); empty = always. While
  // it cannot, no step is attempted: requests wait for it, each at most executor_wait (from
  // its submission or the start of the outage, whichever is later), and then end with kError
  // and `unavailable`. A step that fails while the executor is not ready ends its sequences
  // with `unavailable` too. Called on the engine thread; must be cheap and thread-safe.
  std::function<bool()> executor_ready;
  std::chrono::milliseconds executor_wait{30000};
};

// Counters and gauges for /metrics (coordinator/server/metrics.cc names them, docs/api.md lists
// them). Request counts are per request whatever its n, as vLLM counts them: a request is
// counted once, when its last choice ends, under the first of error, abort, length, stop
// that any of its choices ended with. Token counts are per token: prompt tokens once per
// request (when its first token is sampled, i.e. its prompt has been prefilled), generated
// tokens of every choice.
struct EngineServiceStats {
  uint64_t requests_finished_stop = 0, requests_finished_length = 0, requests_aborted = 0, requests_failed = 0;
  uint64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  // Sequences (a request has n) in the scheduler's running batch and waiting queue
  // (submitted but not yet taken by the engine loop included).
  int num_running = 0, num_waiting = 0;
  // Requests with at least one choice in the running batch, and the other unfinished ones.
  int num_requests_running = 0, num_requests_waiting = 0;
  int kv_blocks_total = 0, kv_blocks_free = 0;
  uint64_t prefix_cache_hit_tokens = 0, preemptions = 0;
  uint64_t prefix_cache_query_tokens = 0;  // prompt (+ output, when resumed) tokens looked up
  uint64_t kv_window_released_blocks = 0;  // given back because a sliding window moved past them
  uint64_t prefill_capped_steps = 0;  // steps whose prompt tokens max_decode_slowdown capped
  int prefill_token_cap = 0;          // that cap in the last step (0: none)
  uint64_t deferred_masks = 0;  // structured-output masks past scheduler.structured_mask_budget_ms
  SpecDecodeStats spec;  // speculative decoding's counters
  // Latency histograms (seconds) since start, per request except itl:
  //   ttft    submit -> first token (every request that got one, aborted ones too);
  //   itl     between consecutive tokens of one choice;
  //   e2e     submit -> last choice finished;
  //   queue   submit -> first scheduled in a step;
  //   prefill first scheduled -> first token;
  //   decode  first token -> last choice finished.
  // e2e, queue, prefill and decode count requests finished by stop or length only.
  LatencyHistogram ttft{ttft_buckets()}, itl{tpot_buckets()}, e2e{e2e_buckets()};
  LatencyHistogram queue{request_phase_buckets()}, prefill{request_phase_buckets()}, decode{request_phase_buckets()};
  bool draining = false;
  // LoRA adapters: those of the running and of the waiting requests (vllm:lora_requests_info),
  // and the requests admitted for each since start (by adapter name).
  std::set<std::string> running_lora, waiting_lora;
  std::map<std::string, uint64_t> lora_requests;
  int max_lora = 0;  // the adapters served (set by the front end that renders the metrics)
  // How the workers' ranks reduce ("loopback", "shm", "gloo", "nccl"; "" = not known yet), set
  // by the front end as max_lora is.
  std::string collectives;
};

class EngineService {
 public:
  // `tokenizer` may be null (no text deltas then, only tokens).
  EngineService(EngineServiceOptions options, StepExecutor& executor, const Tokenizer* tokenizer);
  ~EngineService();  // stop()
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  void start();
  // Whether requests were submitted that the loop has not taken yet (before start(): any
  // submitted at all). A server warming up before start() stops when one comes.
  bool has_untaken_submissions() const;
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
  // LoRA adapters loaded and dropped while serving (/v1/load_lora_adapter): `done` runs (on
  // the engine's thread) once every executor holds the adapter, or, for an unload, once no
  // request runs with it any more and they dropped it; with the step's error if that failed.
  // The caller serves the name only after a load's done, and stops serving it before an unload.
  void load_lora(const std::string& name, const std::string& dir, std::function<void(Status)> done);
  void unload_lora(const std::string& name, std::function<void(Status)> done);

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
