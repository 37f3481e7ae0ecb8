#pragma once
// The serving process (tessera-serve, tessera-coordinator): a worker group over ZeroMQ,
// optionally the local worker processes themselves (supervised: a rank that exits is
// restarted), the engine service and the OpenAI-compatible HTTP server. SIGTERM/SIGINT
// during set-up stops it at once; while serving it drains (503 + Retry-After to new
// requests, running ones finish up to server.drain_timeout_s, every stream is closed
// properly) and shuts all down; a second signal ends the drain at once.
#include <functional>
#include <memory>

#include "common/config.h"
#include "common/status.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/cluster/kv_pool_sizing.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/server/http_server.h"
#include "tools/lib/shutdown_signals.h"

namespace tessera {

struct ServeOptions {
  TesseraConfig config;
  bool spawn_workers = true;  // tessera-serve: yes; tessera-coordinator: workers come on their own
};

// What a front end gets from run_engine_stack: the engine serving the model, the API context
// requests are parsed with, and the process's termination signals.
struct EngineStack {
  const TesseraConfig& config;
  EngineService& service;
  const Tokenizer* tokenizer;  // null: token-id prompts only
  ApiContext api;
  ShutdownSignals& signals;
  // The HTTP server's options for this model (no API keys: serve() adds them).
  std::function<HttpServerOptions(std::shared_ptr<const ReplyCounter> zmq_replies)> http_options;
  std::function<bool()> ready;  // the engine started and the worker group is whole
  // Warms the workers up (server.warm_up; cut short by the first request submitted meanwhile)
  // and starts the engine. The front end calls it once, as soon as it takes requests (they
  // queue until the engine starts) and before it says it is serving. False: a signal stopped
  // the start-up (logged). On false or an error, requests submitted meanwhile have ended.
  std::function<StatusOr<bool>()> start_engine;
};
using FrontEnd = std::function<Status(EngineStack&)>;
// A front end's own checks of the configuration, run before any worker starts.
using Preflight = std::function<Status(const TesseraConfig&)>;

// Starts the workers (local ones when options.spawn_workers), reads the tokenizer and chat
// template while they load, sizes the KV pool and makes the engine; then runs `front_end`
// (which starts the engine, EngineStack::start_engine) and shuts everything down when it
// returns (requests still running are cut).
// A signal during set-up stops it at once (OK, front_end never runs).
Status run_engine_stack(ServeOptions options, const FrontEnd& front_end, const Preflight& preflight = {});

// Runs until a termination signal; OK after a clean shutdown.
Status serve(ServeOptions options);

// The model's side of cache.num_blocks "auto" (coordinator/cluster/kv_pool_sizing.h): each rank's
// KV bytes per block (its KV heads after the tensor-parallel split) and an estimate of its weights,
// read from the checkpoint's config.json and tensor index (no weights loaded).
StatusOr<KvPoolModel> kv_pool_model(const TesseraConfig& config, int64_t max_model_len);

}  // namespace tessera
