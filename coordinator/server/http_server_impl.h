#pragma once
// Internal to the HTTP front end (http_server.cc and the HttpSession files, never included
// elsewhere): the state HttpServer shares with its connections, and what both sides use.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "coordinator/server/http_edges.h"
#include "coordinator/api/batch_store.h"
#include "coordinator/server/http_server.h"
#include "coordinator/server/metrics.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/api/responses_api.h"

namespace tessera {

class HttpSession;

// Retry-After of every 503 and 429: the client may try again (elsewhere, when draining).
inline constexpr const char* kRetryAfterSeconds = "1";

// Engine callbacks check this under its mutex before posting to a connection: once the
// server stops, late events are dropped instead of touching a dead io_context.
struct HttpLiveness {
  std::mutex mu;
  bool alive = true;
};

struct HttpServer::Impl {
  Impl(HttpServerOptions o, EngineService& s, const Tokenizer* t, HttpServer* owner)
      : options(std::move(o)), service(s), tokenizer(t), owner(owner) {}

  void accept();
  // accept() failed for want of file descriptors: try again after a pause that doubles up
  // to 1 s (the listening socket stays readable, so retrying at once would spin).
  void back_off_accepting();
  // Past max_connections: a short 503 written without waiting, then close.
  void refuse_connection(boost::asio::ip::tcp::socket socket);
  void add_session(const std::shared_ptr<HttpSession>& s, bool probe_only);
  void remove_session(bool probe_only);
  void close_acceptor();  // posted to the io_context
  // Posts `what` to every live connection's strand.
  void post_to_sessions(void (HttpSession::*what)());
  // Until no connection is left (true) or `timeout` passes (false).
  bool wait_sessions_closed(std::chrono::milliseconds timeout);

  HttpServerOptions options;
  HttpLimits limits;  // from options, by start()
  EngineService& service;
  const Tokenizer* tokenizer;
  HttpServer* owner;
  ApiContext api;
  CorsPolicy cors;
  boost::asio::io_context ioc;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor;
  std::optional<boost::asio::steady_timer> accept_timer;  // the accept back-off
  std::chrono::milliseconds accept_backoff{0};            // the last pause; 0 after a good accept
  std::chrono::steady_clock::time_point last_fd_warning{};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  // Where requests are prepared (tokenization, chat templates, grammar compilation; /tokenize
  // and /detokenize): off the I/O threads, so that a heavy request never delays /health,
  // /ready or another connection's stream (HttpSession::off_io). Bodies over
  // kLargeBodyBytes go to threads of their own at a lower CPU priority, so that a few huge
  // ones never queue the ordinary requests behind them.
  struct PrepPool {
    boost::asio::io_context ioc;
    std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
    std::vector<std::thread> threads;
  };
  static constexpr size_t kLargeBodyBytes = size_t{256} << 10;
  PrepPool prep_small, prep_large;
  boost::asio::io_context& prep_for(size_t body_bytes) {
    return body_bytes > kLargeBodyBytes ? prep_large.ioc : prep_small.ioc;
  }
  std::unique_ptr<BatchStore> batches;  // the Batch API (server.batch_dir); null without it
  std::atomic<bool> draining{false};
  std::atomic<int> port{0};
  bool started = false;
  std::shared_ptr<HttpLiveness> liveness = std::make_shared<HttpLiveness>();

  ReplyCounter responses;  // for tessera:http_responses_total
  // /v1/responses kept for previous_response_id and GET /v1/responses/{id}.
  ResponseStore response_store{static_cast<size_t>(options.responses_max_stored),
                               std::chrono::seconds(options.responses_max_age_s)};

  std::mutex sessions_mu;
  std::condition_variable sessions_cv;
  std::vector<std::weak_ptr<HttpSession>> sessions;
  int live_sessions = 0;   // every open connection, probe connections included
  int probe_sessions = 0;  // those past max_connections, for a probe only (HttpLimits::probe_reserve)
};

// The 503 of a server at its connection cap (server.http.max_connections).
ApiError too_many_connections_error();

// Seconds since the Unix epoch: the "created" of responses and model cards.
int64_t unix_now();

}  // namespace tessera
