#pragma once
// The OpenAI-compatible HTTP/1.1 front end (Boost.Beast on Asio, kept out of this header):
// accepts connections, parses requests (body limit, keep-alive, Expect: 100-continue),
// routes them, and streams server-sent events. Beast serializes every response: status line,
// headers, and the chunked framing of event streams. Request JSON is decoded by
// coordinator/api/openai_api.h; generation goes through the thread-safe EngineService, whose
// callbacks are posted to the connection's strand (the engine thread never blocks here).
// A client that disconnects has its requests aborted at once, so their KV blocks are freed.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
// POST /tokenize, POST /detokenize, GET /health, GET /ready, GET /metrics (Prometheus text); HEAD
// on every GET route, OPTIONS on every route (CORS preflight, coordinator/server/http_edges.h). API
// keys (when set) guard /v1/* only. Requests whose body cannot be framed or decoded
// (Transfer-Encoding other than chunked, Content-Encoding other than identity) and HTTP/1.1
// requests without Host are refused before their body is read, and the connection closed.
// Connections beyond max_connections may still ask for /health, /ready or /metrics (a small reserve
// of probe connections, HttpLimits::probe_reserve); anything else gets 503 and the connection
// closes. When accept() runs out of file descriptors the listener pauses (backing off up to 1 s)
// instead of spinning.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/server/metrics.h"
#include "coordinator/api/openai_api.h"

namespace tessera {

// Every limit and timeout of the HTTP front end, in one place. HttpServer::start() maps its
// HttpServerOptions to these once (http_limits()); max_body_bytes, max_connections,
// idle_timeout and header_timeout are configurable from YAML (server.http.*,
// docs/configuration.md), the rest are fixed here.
struct HttpLimits {
  uint64_t max_body_bytes = 1 << 20;      // a larger request body gets 413 and the connection closes
  uint32_t max_header_bytes = 64 * 1024;  // request line + headers; more is a 400
  // Open client connections; a connection accepted beyond it is a probe connection (below)
  // while there is room for one, else answered 503 at once and closed.
  int max_connections = 10000;
  // Past max_connections, so /health, /ready and /metrics still answer (a load balancer or
  // Kubernetes probe must not read a full server as a dead one): up to this many more
  // connections, each with probe_head_wait for its request head. A GET/HEAD of a probe path is
  // answered; anything else, or nothing in time, gets the 503 of a full server; then each
  // closes. These few fit in the descriptors the fd-derived cap keeps in reserve.
  int probe_reserve = 16;
  std::chrono::milliseconds probe_head_wait{500};
  // Waiting for the first byte of the next request on a kept-alive connection, or for a
  // request's body (after a 100 Continue too): the connection is closed when it passes.
  std::chrono::seconds idle_timeout{120};
  // From a new connection's accept, or a next request's first byte, to the end of its
  // headers (a client that trickles its headers holds a connection no longer than this).
  std::chrono::seconds header_timeout{10};
  // One write (a whole response, or one event of a stream) the client does not take: the
  // connection is closed and its request aborted.
  std::chrono::seconds write_timeout{30};
  // After the last answer on a closing connection: how long what the client still sends (the
  // rest of a body over the limit) is drained, so closing does not reset before it reads.
  std::chrono::seconds close_linger{2};
  // HttpServer::stop(): how long it waits for the connections to close; stop_gracefully():
  // how long connections may take to flush what they still have to write and close (more
  // than close_linger, so a closing connection's linger fits).
  std::chrono::seconds stop_grace{5};
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0 = pick a free port (see HttpServer::port())
  std::vector<std::string> api_keys;  // empty = no authentication
  int64_t max_body_bytes = 1 << 20;   // HttpLimits::max_body_bytes, >= 0
  std::string model_name;             // what /v1/models lists and "model" must equal
  // LoRA adapters served beside it (lora.adapters: name -> folder; the workers load them):
  // listed by /v1/models with the model as parent, and a request's "model" may name one.
  std::shared_ptr<ServedLoras> lora_adapters;  // null: none
  // lora.runtime_updates: POST /v1/load_lora_adapter and /v1/unload_lora_adapter are served;
  // check_lora reads an adapter against the model before any worker is asked to load it (the
  // error is the client's 400).
  bool lora_runtime_updates = false;
  // lora.max_loras: the `max_lora` of vllm:lora_requests_info; 0 (no limit): the number served.
  int lora_max_loras = 0;
  // How the workers' ranks reduce, for /metrics (tessera:collectives_info); null: not shown.
  std::function<std::string()> collectives;
  std::function<Status(const std::string& name, const std::string& dir)> check_lora;
  int threads = 2;                    // io_context threads
  ChatRenderer chat_renderer;         // chat template context -> prompt text; empty = the tokenizer's template
  std::optional<ToolCallFormat> tool_call_format;  // how tool calls are read; nullopt = auto (openai_api.h)
  std::optional<ReasoningFormat> reasoning_format;  // how chat thoughts are told apart; nullopt = auto (ditto)
  // server.task: completions and chat answered; embeddings answered, pooled so (unset: refused).
  bool generation = true;
  std::optional<EmbeddingPooling> embeddings;
  // /v1/responses stored (store: true) for previous_response_id and GET: at most this many,
  // none older than this (server.responses.max_stored, server.responses.max_age_s).
  int responses_max_stored = 1000;
  int responses_max_age_s = 3600;
  // server.batch_dir: where the Batch API keeps its files and batches ("" = no Batch API).
  std::string batch_dir;
  int idle_timeout_s = 120;           // HttpLimits::idle_timeout, >= 1
  int header_timeout_s = 10;          // HttpLimits::header_timeout, >= 1
  // HttpLimits::max_connections; 0 = as many as the file-descriptor limit (RLIMIT_NOFILE)
  // leaves room for, keeping a reserve for the rest of the process. A larger explicit value
  // is kept (with a warning): accept() then meets EMFILE, and the listener backs off.
  int max_connections = 0;
  std::vector<std::string> cors_origins;  // allowed browser origins ("*" = any); empty = no CORS
  // /metrics also shows these (the ZeroMQ client API's replies, when it runs); may be null.
  std::shared_ptr<const ReplyCounter> zmq_replies;
};

// The limits `options` ask for; InvalidArgument naming the option when one is out of range.
StatusOr<HttpLimits> http_limits(const HttpServerOptions& options);

class HttpServer {
 public:
  // `tokenizer` may be null: then only token-id prompts are accepted.
  HttpServer(HttpServerOptions options, EngineService& service, const Tokenizer* tokenizer);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; returns once connections are accepted (or the bind error, or the
  // error of an option out of range).
  Status start();
  // The bound port (the chosen one when options.port was 0); 0 before start().
  int port() const;
  // Closes the listener and every connection (aborting their requests), joins the threads.
  void stop();
  // The end of a drain (after EngineService::drain_and_stop, when every request has had its
  // last event): closes the listener, lets every connection write what it still holds (the
  // response, or a stream's last chunk, `data: [DONE]` and the chunked terminator) and close,
  // for up to HttpLimits::stop_grace; then stop(). An idle kept-alive connection is closed.
  void stop_gracefully();
  // While draining, new generation requests get 503 and GET /ready is 503.
  void set_draining(bool draining);
  bool draining() const;

  // GET /ready is 200 when this returns true (and the server is not draining), else 503.
  // Empty = always ready. Set before start(); called on an I/O thread.
  std::function<bool()> ready_check;

 private:
  friend class HttpSession;  // one connection (coordinator/server/http_session.h)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
