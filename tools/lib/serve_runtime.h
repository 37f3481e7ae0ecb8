#pragma once
// The serving process (tessera-serve, tessera-coordinator): a worker group over ZeroMQ,
// optionally the local worker processes themselves (supervised: a rank that exits is
// restarted), the engine service and the OpenAI-compatible HTTP server; SIGTERM/SIGINT
// drains (503 to new requests, running ones finish up to a deadline) and shuts all down.
#include "common/config.h"
#include "common/status.h"

namespace tessera {

struct ServeOptions {
  TesseraConfig config;
  bool spawn_workers = true;  // tessera-serve: yes; tessera-coordinator: workers come on their own
  int drain_seconds = 30;
};

// Runs until a termination signal; OK after a clean shutdown.
Status serve(ServeOptions options);

// KV blocks per rank when cache.num_blocks is "auto": memory_fraction of this host's
// available memory, less the model, shared by the local ranks; at most what max_num_seqs
// sequences of max_model_len need, at least one such sequence.
StatusOr<int64_t> auto_kv_blocks(const TesseraConfig& config, int64_t max_model_len);

}  // namespace tessera
