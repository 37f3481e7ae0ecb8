#pragma once
// The OpenAI-compatible HTTP/1.1 front end (Boost.Beast on Asio, kept out of this header):
// accepts connections, parses requests (body limit, keep-alive, Expect: 100-continue),
// routes them, and streams server-sent events. Beast serializes every response: status line,
// headers, and the chunked framing of event streams. Request JSON is decoded by
// coordinator/openai_api.h; generation goes through the thread-safe EngineService, whose
// callbacks are posted to the connection's strand (the engine thread never blocks here).
// A client that disconnects has its requests aborted at once, so their KV blocks are freed.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
// GET /ready, GET /metrics (Prometheus text). API keys (when set) guard /v1/* only.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine_service.h"
#include "coordinator/metrics.h"
#include "coordinator/openai_api.h"

namespace tessera {

// Every limit and timeout of the HTTP front end, in one place. HttpServer::start() maps its
// HttpServerOptions to these once (http_limits()); only max_body_bytes is configurable from
// YAML (server.http.max_body_bytes, docs/configuration.md), the rest are fixed here.
struct HttpLimits {
  uint64_t max_body_bytes = 1 << 20;      // a larger request body gets 413 and the connection closes
  uint32_t max_header_bytes = 64 * 1024;  // request line + headers; more is a 400
  // Waiting for the next request on a kept-alive connection, or for the rest of one (its
  // body too, after a 100 Continue): the connection is closed when it passes.
  std::chrono::seconds idle_timeout{120};
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
  int threads = 2;                    // io_context threads
  ChatRenderer chat_renderer;         // chat messages -> prompt text; empty = join contents
  int idle_timeout_s = 120;           // HttpLimits::idle_timeout, >= 1
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
  friend class HttpSession;  // one connection (http_server.cc)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
