#pragma once
// The ZeroMQ client API (docs/api.md, "ZeroMQ client API"): a ROUTER socket at
// `server.zmq_client` for low-overhead programmatic access from inside a cluster. Clients
// (tools/client/zmq_client.h) send Submit frames carrying an OpenAI request body and get
// Delta frames (text + token ids per choice), then one Final, or one Error, back
// (common/wire/client_messages.h). Requests are decoded by parse_api_request and run by the
// same EngineService as HTTP, so validation and error objects are those of REST.
//
// One thread owns the socket. Engine callbacks never block: they queue their event and wake
// that thread through an eventfd. A client whose connection is gone (a send fails at once
// under ROUTER_MANDATORY; ZMTP heartbeats notice silent peers) has all its requests aborted,
// freeing their KV blocks.
#include <chrono>
#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/server/metrics.h"
#include "coordinator/api/openai_api.h"

namespace tessera {

struct ZmqClientServerOptions {
  std::string endpoint = "tcp://127.0.0.1:5555";  // tcp://HOST:PORT (PORT * = any), ipc://PATH
  std::vector<std::string> api_keys;              // empty = no authentication
  int64_t max_body_bytes = 1 << 20;               // larger request JSON gets 413
  std::string model_name;                         // what "model" must equal when given
  std::shared_ptr<ServedLoras> lora_adapters;  // or one of these adapters' names (null: none)
  ChatRenderer chat_renderer;  // empty = the tokenizer's chat template (as HttpServer)
  std::optional<ReasoningFormat> reasoning_format;  // as HttpServerOptions: nullopt = auto
  bool generation = true;                          // as HttpServerOptions (server.task)
  std::optional<EmbeddingPooling> embeddings;
  // ZMTP heartbeats: a PING every interval; a peer silent for 3 intervals is disconnected.
  std::chrono::milliseconds heartbeat_interval{1000};
  // Counts every reply (Final = 200, Error = its status) for /metrics; made when null.
  std::shared_ptr<ReplyCounter> replies;
  // Z85 (40 characters) CURVE server secret key; empty = no encryption.
  std::string curve_server_secret_key;
};

class ZmqClientServer {
 public:
  // `tokenizer` may be null: then only token-id prompts are accepted.
  ZmqClientServer(ZmqClientServerOptions options, EngineService& service, const Tokenizer* tokenizer);
  ~ZmqClientServer();  // stop()
  ZmqClientServer(const ZmqClientServer&) = delete;
  ZmqClientServer& operator=(const ZmqClientServer&) = delete;

  // Binds and starts the socket thread; InvalidArgument for an endpoint that cannot be bound.
  Status start();
  // The bound address (the chosen port for tcp://HOST:*); empty before start().
  std::string endpoint() const;
  // Ends every live request with an Error 503 reply (aborting it), sends what is still
  // queued (every reply already made, up to 2 s for slow or gone peers), closes the socket
  // and joins the thread. After EngineService::drain_and_stop, every request has had its
  // Final (or Error) and nothing is left to abort.
  void stop();
  // While draining, new Submits get Error 503; running requests go on.
  void set_draining(bool draining);
  bool draining() const;

  // Requests in flight (for tests and metrics).
  size_t live_requests() const;
  // Replies sent so far, by status (options.replies).
  std::map<int, uint64_t> reply_counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
