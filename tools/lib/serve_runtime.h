#pragma once
// The serving process (tessera-serve, tessera-coordinator): a worker group over ZeroMQ,
// optionally the local worker processes themselves (supervised: a rank that exits is
// restarted), the engine service and the OpenAI-compatible HTTP server. SIGTERM/SIGINT
// during set-up stops it at once; while serving it drains (503 + Retry-After to new
// requests, running ones finish up to server.drain_timeout_s, every stream is closed
// properly) and shuts all down; a second signal ends the drain at once.
#include "common/config.h"
#include "common/status.h"
#include "coordinator/cluster/kv_pool_sizing.h"

namespace tessera {

struct ServeOptions {
  TesseraConfig config;
  bool spawn_workers = true;  // tessera-serve: yes; tessera-coordinator: workers come on their own
};

// Runs until a termination signal; OK after a clean shutdown.
Status serve(ServeOptions options);

// The model's side of cache.num_blocks "auto" (coordinator/cluster/kv_pool_sizing.h): each rank's
// KV bytes per block (its KV heads after the tensor-parallel split) and an estimate of its weights,
// read from the checkpoint's config.json and tensor index (no weights loaded).
StatusOr<KvPoolModel> kv_pool_model(const TesseraConfig& config, int64_t max_model_len);

}  // namespace tessera
