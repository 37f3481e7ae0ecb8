#pragma once
// Offline batches in OpenAI's Batch API shape: a JSONL of requests in, a JSONL of results out,
// one result line per request in the order they finish (`custom_id` tells them apart). Each
// input line is {"custom_id", "method": "POST", "url": "/v1/completions" |
// "/v1/chat/completions" | "/v1/embeddings", "body"}; each result line is {"id",
// "custom_id", "response": {"status_code", "request_id", "body"}, "error"}. A line that is not
// such a request (not JSON, no custom_id, a repeated custom_id, another method or url, a
// streamed body) gets a result with "response": null and "error": {"code", "message"} naming
// the line; a body the API refuses gets its 4xx response, as online. Neither stops the batch.
// tessera-batch runs this without a server (docs/api.md, "Offline batches").
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <istream>
#include <ostream>
#include <string>

#include "common/status.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/engine/engine_service.h"

namespace tessera {

struct BatchCounts {
  int64_t total = 0;      // request lines read so far (blank lines are not requests)
  int64_t completed = 0;  // results with status 200
  int64_t failed = 0;     // results with an error (the line, the body, or the engine)
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double seconds = 0;     // since the batch began
  bool input_done = false;  // every line is read: total is final
  int64_t finished() const { return completed + failed; }
};

struct BatchRunOptions {
  // Requests in the engine at once: enough to fill the largest batch the scheduler forms.
  int max_in_flight = 256;
  // Called every `progress_every` (0: never) and once at the end (a cancelled run too), from
  // the calling thread.
  std::function<void(const BatchCounts&)> on_progress;
  std::chrono::milliseconds progress_every{2000};
  // Set from another thread (a signal): no further line is submitted, the running ones are
  // aborted, and run_batch_jsonl returns Cancelled once their results are written.
  const std::atomic<bool>* cancel = nullptr;
  // Non-empty: every line's url must be this one (a batch of the Batch API names its endpoint).
  std::string only_url;
  // Set: failed results go here instead of `out` (the Batch API's error file).
  std::ostream* errors = nullptr;
};

// Runs every request of `in` through `service` (as parsed with `api`) and writes their result
// lines to `out`. An error only for the streams themselves (unreadable input, unwritable
// output) or cancellation; request errors are result lines.
StatusOr<BatchCounts> run_batch_jsonl(EngineService& service, const ApiContext& api, std::istream& in,
                                      std::ostream& out, const BatchRunOptions& options);

// "12 of 500 done (1 failed), 340 tokens/s, ETA 41 s" (ETA once some are done and the total
// is known).
std::string describe_batch_progress(const BatchCounts& counts);

}  // namespace tessera
