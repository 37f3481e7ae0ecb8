#include "coordinator/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "common/logging.h"
#include "coordinator/api_submission.h"
#include "coordinator/metrics.h"

namespace tessera {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// Extra response headers: (name, value), set through Beast's fields.
using Headers = std::vector<std::pair<beast::string_view, std::string>>;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Engine callbacks check this under its mutex before posting to a connection: once the
// server stops, late events are dropped instead of touching a dead io_context.
struct Liveness {
  std::mutex mu;
  bool alive = true;
};

}  // namespace

class HttpSession;

struct HttpServer::Impl {
  Impl(HttpServerOptions o, EngineService& s, const Tokenizer* t, HttpServer* owner)
      : options(std::move(o)), service(s), tokenizer(t), owner(owner) {}

  void accept();
  void add_session(const std::shared_ptr<HttpSession>& s);
  void remove_session(HttpSession* s);

  HttpServerOptions options;
  HttpLimits limits;  // from options, by start()
  EngineService& service;
  const Tokenizer* tokenizer;
  HttpServer* owner;
  ApiContext api;
  asio::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::atomic<bool> draining{false};
  std::atomic<int> port{0};
  bool started = false;
  std::shared_ptr<Liveness> liveness = std::make_shared<Liveness>();

  ReplyCounter responses;  // for tessera:http_responses_total

  std::mutex sessions_mu;
  std::condition_variable sessions_cv;
  std::vector<std::weak_ptr<HttpSession>> sessions;
  int live_sessions = 0;
};

// One connection. Every member is touched only on the connection's strand.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(HttpServer::Impl& server, tcp::socket socket) : server_(server), stream_(std::move(socket)) {}
  ~HttpSession() { server_.remove_session(this); }

  void start() {
    beast::error_code ec;
    stream_.socket().non_blocking(true, ec);  // for the MSG_PEEK disconnect probe
    stream_.socket().set_option(tcp::no_delay(true), ec);
    do_read();
  }

  // From HttpServer::stop (posted to the strand): abort everything and close.
  void shutdown() { disconnect(); }
  // The connection's strand.
  beast::tcp_stream::executor_type shutdown_executor() { return stream_.get_executor(); }

 private:
  struct Generation {
    uint64_t serial = 0;
    ApiRequest request;
    std::string id;
    int64_t created = 0;
    std::vector<RequestId> request_ids;  // one per prompt
    std::vector<bool> done;              // per choice
    std::vector<ChoiceOutput> outputs;
    int remaining = 0;
    std::string error;  // first engine error
  };

  // ---- reading -------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(server_.limits.max_body_bytes);
    parser_->header_limit(server_.limits.max_header_bytes);
    stream_.expires_after(server_.limits.idle_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    auto& req = parser_->get();
    auto expect = req.find(http::field::expect);
    if (expect != req.end() && beast::iequals(expect->value(), "100-continue")) {
      // Still under the request's idle deadline: the client waits for this before the body.
      auto go_on = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      http::async_write(stream_, *go_on, [self = shared_from_this(), go_on](beast::error_code ec2, size_t) {
        if (ec2) return self->disconnect();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      version_ = 11;
      keep_alive_ = false;
      return send_error(api_error(413, "invalid_request_error", "request_too_large",
                                  "request body exceeds " + std::to_string(server_.limits.max_body_bytes) +
                                      " bytes"));
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return disconnect();
    }
    // A malformed request: answer 400 once and close.
    version_ = 11;
    keep_alive_ = false;
    send_error(api_error(400, "invalid_request_error", "bad_http", "malformed HTTP request: " + ec.message()));
  }

  void on_read(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    http::request<http::string_body> req = parser_->release();
    version_ = req.version();
    keep_alive_ = req.keep_alive();
    handle(req);
  }

  // ---- routing ---------------------------------------------------------------------------
  void handle(const http::request<http::string_body>& req) {
    std::string path(req.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    const http::verb method = req.method();
    auto route = [&](http::verb want, const char* allow) -> bool {
      if (method == want) return true;
      send_error(api_error(405, "invalid_request_error", "method_not_allowed",
                           "method " + std::string(req.method_string()) + " is not allowed on " + path),
                 {{"Allow", allow}});
      return false;
    };
    if (path == "/health") {
      if (!route(http::verb::get, "GET")) return;
      return send(200, "application/json",
                  server_.draining ? R"({"status":"draining"})" : R"({"status":"ok"})");
    }
    if (path == "/ready") {
      if (!route(http::verb::get, "GET")) return;
      const bool ready =
          !server_.draining && (!server_.owner->ready_check || server_.owner->ready_check());
      return send(ready ? 200 : 503, "application/json",
                  ready ? R"({"status":"ready"})" : R"({"status":"not ready"})");
    }
    if (path == "/metrics") {
      if (!route(http::verb::get, "GET")) return;
      return send(200, "text/plain; version=0.0.4; charset=utf-8",
                  render_metrics(server_.service.stats(), server_.options.model_name, server_.responses.snapshot(),
                                 server_.options.zmq_replies ? server_.options.zmq_replies->snapshot()
                                                             : std::map<int, uint64_t>{}));
    }
    const bool is_models = path == "/v1/models";
    const bool is_completions = path == "/v1/completions";
    const bool is_chat = path == "/v1/chat/completions";
    if (!is_models && !is_completions && !is_chat) {
      return send_error(api_error(404, "invalid_request_error", "not_found", "no route for " + path));
    }
    if (!route(is_models ? http::verb::get : http::verb::post, is_models ? "GET" : "POST")) return;
    if (!authorized(req)) {
      return send_error(api_error(401, "invalid_request_error", "invalid_api_key",
                                  "missing or invalid API key (send 'Authorization: Bearer <key>')"),
                        {{"WWW-Authenticate", "Bearer"}});
    }
    if (is_models) {
      return send(200, "application/json",
                  models_body(server_.options.model_name, server_.api.max_model_len, unix_now()));
    }
    if (server_.draining) {
      return send_error(api_error(503, "service_unavailable", "draining", "the server is draining"));
    }
    start_generation(is_chat ? ApiEndpoint::kChatCompletions : ApiEndpoint::kCompletions, req.body());
  }

  // The key is "Authorization: Bearer <key>"; whether it is accepted is api_key_accepted's call.
  bool authorized(const http::request<http::string_body>& req) const {
    std::string_view key;
    if (auto it = req.find(http::field::authorization); it != req.end()) {
      const std::string_view v(it->value().data(), it->value().size());
      constexpr std::string_view kBearer = "Bearer ";
      if (v.size() > kBearer.size() && beast::iequals(beast::string_view(v.data(), kBearer.size()),
                                                      beast::string_view(kBearer.data(), kBearer.size())))
        key = v.substr(kBearer.size());
    }
    return api_key_accepted(server_.options.api_keys, key);
  }

  // ---- generation ------------------------------------------------------------------------
  void start_generation(ApiEndpoint endpoint, const std::string& body) {
    auto g = std::make_unique<Generation>();
    ApiError error;
    if (!parse_api_request(endpoint, body, server_.api, &g->request, &error)) return send_error(error);
    g->serial = ++serial_;
    g->id = make_response_id(endpoint);
    g->created = unix_now();
    const size_t n = g->request.num_choices();
    g->done.assign(n, false);
    g->outputs.assign(n, ChoiceOutput());
    g->remaining = static_cast<int>(n);
    gen_ = std::move(g);

    StatusOr<std::vector<RequestId>> ids = submit_api_request(server_.service, gen_->request, make_callback(gen_->serial));
    if (!ids.is_ok()) {
      gen_.reset();  // the prompts submitted so far were aborted; their late events find no generation
      const ApiError e = api_error_of(ids.status());
      if (e.http_status == 429) return send_error(e, {{"Retry-After", "1"}});
      return send_error(e);
    }
    gen_->request_ids = std::move(ids).value();
    keep_ = shared_from_this();  // alive until the generation ends, even with nothing pending
    if (gen_->request.stream) begin_stream();
    watch_disconnect(gen_->serial);
  }

  ChoiceCallback make_callback(uint64_t serial) {
    std::weak_ptr<HttpSession> weak = weak_from_this();
    std::shared_ptr<Liveness> live = server_.liveness;
    return [weak, live, serial](size_t index, const GenerateEvent& ev) {
      std::lock_guard<std::mutex> lock(live->mu);
      if (!live->alive) return;
      std::shared_ptr<HttpSession> self = weak.lock();
      if (!self) return;
      asio::post(self->stream_.get_executor(),
                 [self, serial, index, ev]() { self->on_event(serial, index, ev); });
    };
  }

  void on_event(uint64_t serial, size_t index, const GenerateEvent& ev) {
    if (!gen_ || gen_->serial != serial || gen_->done[index]) return;
    Generation& g = *gen_;
    ChoiceOutput& out = g.outputs[index];
    out.text += ev.text;
    out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    out.completion_tokens = ev.completion_tokens;
    if (ev.finished) {
      out.finish_reason = ev.finish_reason;
      if (ev.finish_reason == FinishReason::kError && g.error.empty())
        g.error = ev.error.empty() ? "generation failed" : ev.error;
    }
    if (g.request.stream) {
      if (ev.finished && ev.finish_reason == FinishReason::kError) {
        ApiError e = api_error(500, "server_error", "internal_error", g.error);
        queue_chunk(sse_event(error_body(e)));
      } else if (!ev.text.empty() || ev.finished || (g.request.logprobs >= 0 && !ev.tokens.empty())) {
        queue_chunk(sse_event(stream_chunk_body(g.request, g.id, g.created, static_cast<int>(index), ev.text,
                                                ev.tokens, ev.finished ? ev.finish_reason : FinishReason::kNone, false,
                                                server_.tokenizer)));
      }
    }
    if (!ev.finished) return;
    g.done[index] = true;
    if (--g.remaining > 0) return;
    finish_generation();
  }

  void begin_stream() {
    Generation& g = *gen_;
    // HTTP/1.1 streams are chunked, one event a chunk; HTTP/1.0 has no chunks, so its stream
    // ends when the connection closes.
    auto head = std::make_unique<Outgoing>(Outgoing::Kind::kStreamHead);
    head->response = make_response(200, "text/event-stream", keep_alive_ && version_ != 10,
                                   {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
    if (version_ != 10) head->response.chunked(true);
    server_.responses.add(200);
    enqueue(std::move(head));
    for (size_t i = 0; i < g.request.num_choices(); ++i) {
      if (g.request.endpoint == ApiEndpoint::kChatCompletions) {
        queue_chunk(sse_event(stream_chunk_body(g.request, g.id, g.created, static_cast<int>(i), "", {},
                                                FinishReason::kNone, true, server_.tokenizer)));
      } else if (g.request.echo) {
        queue_chunk(sse_event(stream_chunk_body(g.request, g.id, g.created, static_cast<int>(i),
                                                g.request.prompt_texts[i / g.request.n], {}, FinishReason::kNone,
                                                false, server_.tokenizer)));
      }
    }
  }

  void finish_generation() {
    std::unique_ptr<Generation> g = std::move(gen_);
    if (g->request.stream) {
      if (g->request.include_usage)
        queue_chunk(sse_event(stream_usage_body(g->request, g->id, g->created, usage_of(g->request, g->outputs))));
      queue_chunk(std::string(kSseDone));
      if (version_ == 10) {
        keep_alive_ = false;
      } else {
        enqueue(std::make_unique<Outgoing>(Outgoing::Kind::kStreamEnd));
      }
      after_write_ = keep_alive_ ? AfterWrite::kRead : AfterWrite::kClose;
      if (!writing_) after_writes();
    } else if (!g->error.empty()) {
      send_error(api_error(500, "server_error", "internal_error", g->error));
    } else {
      send(200, "application/json", response_body(g->request, g->id, g->created, g->outputs, server_.tokenizer));
    }
    keep_.reset();
  }

  // Aborts every unfinished choice of the current generation (disconnect).
  void abort_generation() {
    if (!gen_) return;
    abort_api_request(server_.service, gen_->request_ids);
    gen_.reset();
    keep_.reset();
  }

  // Readable while a generation runs: either the client closed (EOF/reset: abort at once)
  // or it pipelined its next request (leave it in the socket for the next read).
  void watch_disconnect(uint64_t serial) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), serial](beast::error_code ec) {
      if (ec || !self->gen_ || self->gen_->serial != serial) return;
      char c;
      beast::error_code pec;
      const size_t got = self->stream_.socket().receive(asio::buffer(&c, 1), tcp::socket::message_peek, pec);
      if (pec == asio::error::would_block || pec == asio::error::try_again) return self->watch_disconnect(serial);
      if (pec || got == 0) {
        TESSERA_LOG_INFO("[coord] http client disconnected; aborting request {}", self->gen_->id);
        return self->disconnect();
      }
    });
  }

  // ---- writing ---------------------------------------------------------------------------
  enum class AfterWrite { kNone, kRead, kClose };

  // One thing to write; the queue writes them in order, one at a time. Beast serializes all
  // of them: a whole response (http::async_write), the head of an event stream
  // (http::async_write_header), one event (http::make_chunk; its bare bytes on HTTP/1.0) and
  // the end of a stream (http::make_chunk_last).
  struct Outgoing {
    enum class Kind { kResponse, kStreamHead, kEvent, kStreamEnd };
    explicit Outgoing(Kind k) : kind(k) {}
    Kind kind;
    http::response<http::string_body> response;  // kResponse, kStreamHead
    std::optional<http::response_serializer<http::string_body>> head_serializer;  // kStreamHead, while written
    std::string event;  // kEvent: "data: ...\n\n"
  };

  // A response to the current request: its HTTP version, Tessera's Server header, and a
  // Connection header as Beast derives it from `keep_alive`.
  http::response<http::string_body> make_response(int status, std::string_view content_type, bool keep_alive,
                                                  const Headers& extra) const {
    http::response<http::string_body> res;
    res.version(version_);
    res.result(static_cast<unsigned>(status));
    res.set(http::field::server, "tessera");
    res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
    for (const auto& [name, value] : extra) res.set(name, beast::string_view(value));
    res.keep_alive(keep_alive);
    return res;
  }

  void send(int status, std::string_view content_type, std::string body, const Headers& extra = {}) {
    auto out = std::make_unique<Outgoing>(Outgoing::Kind::kResponse);
    out->response = make_response(status, content_type, keep_alive_, extra);
    out->response.body() = std::move(body);
    out->response.prepare_payload();  // Content-Length
    server_.responses.add(status);
    enqueue(std::move(out));
    after_write_ = keep_alive_ ? AfterWrite::kRead : AfterWrite::kClose;
    if (!writing_) after_writes();
  }

  void send_error(const ApiError& e, const Headers& extra = {}) {
    send(e.http_status, "application/json", error_body(e), extra);
  }

  void queue_chunk(std::string event) {
    auto out = std::make_unique<Outgoing>(Outgoing::Kind::kEvent);
    out->event = std::move(event);
    enqueue(std::move(out));
  }

  void enqueue(std::unique_ptr<Outgoing> out) {
    if (closed_) return;
    queue_.push_back(std::move(out));
    if (!writing_) write_next();
  }

  void write_next() {
    if (queue_.empty()) {
      writing_ = false;
      return after_writes();
    }
    writing_ = true;
    Outgoing& out = *queue_.front();
    stream_.expires_after(server_.limits.write_timeout);
    auto written = [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); };
    switch (out.kind) {
      case Outgoing::Kind::kResponse:
        return http::async_write(stream_, out.response, std::move(written));
      case Outgoing::Kind::kStreamHead:
        out.head_serializer.emplace(out.response);
        return http::async_write_header(stream_, *out.head_serializer, std::move(written));
      case Outgoing::Kind::kEvent:
        if (version_ == 10) return asio::async_write(stream_, asio::buffer(out.event), std::move(written));
        return asio::async_write(stream_, http::make_chunk(asio::buffer(out.event)), std::move(written));
      case Outgoing::Kind::kStreamEnd:
        return asio::async_write(stream_, http::make_chunk_last(), std::move(written));
    }
  }

  void on_written(beast::error_code ec) {
    if (ec || closed_) {
      writing_ = false;
      queue_.clear();
      return disconnect();
    }
    stream_.expires_never();  // a stream waits for its next event without a deadline
    queue_.pop_front();
    write_next();
  }

  void after_writes() {
    const AfterWrite next = after_write_;
    after_write_ = AfterWrite::kNone;
    if (next == AfterWrite::kRead) {
      do_read();
    } else if (next == AfterWrite::kClose) {
      // Half-close, then drain what the client still sends (e.g. the rest of a body over
      // the limit) so closing does not reset the connection before it reads our answer.
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      closed_ = true;
      stream_.expires_after(server_.limits.close_linger);
      linger();
    }
  }

  void linger() {
    stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->stream_.close();
      self->linger();
    });
  }

  void disconnect() {
    abort_generation();
    if (closed_) return;
    closed_ = true;
    if (!writing_) queue_.clear();  // an in-flight write still reads queue_.front()
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  HttpServer::Impl& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  std::unique_ptr<Generation> gen_;
  uint64_t serial_ = 0;
  std::shared_ptr<HttpSession> keep_;
  std::deque<std::unique_ptr<Outgoing>> queue_;
  char scratch_[4096];
  bool writing_ = false;
  bool closed_ = false;
  AfterWrite after_write_ = AfterWrite::kNone;
};

void HttpServer::Impl::add_session(const std::shared_ptr<HttpSession>& s) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  ++live_sessions;
  std::erase_if(sessions, [](const std::weak_ptr<HttpSession>& w) { return w.expired(); });
  sessions.push_back(s);
}

void HttpServer::Impl::remove_session(HttpSession*) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  --live_sessions;
  sessions_cv.notify_all();
}

void HttpServer::Impl::accept() {
  acceptor->async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      auto session = std::make_shared<HttpSession>(*this, std::move(socket));
      add_session(session);
      asio::dispatch(session->shutdown_executor(), [session]() { session->start(); });
    }
    accept();
  });
}

StatusOr<HttpLimits> http_limits(const HttpServerOptions& options) {
  if (options.max_body_bytes < 0)
    return invalid_argument("HttpServerOptions::max_body_bytes is " + std::to_string(options.max_body_bytes) +
                            ": must be >= 0");
  if (options.idle_timeout_s < 1)
    return invalid_argument("HttpServerOptions::idle_timeout_s is " + std::to_string(options.idle_timeout_s) +
                            ": must be >= 1");
  HttpLimits limits;
  limits.max_body_bytes = static_cast<uint64_t>(options.max_body_bytes);
  limits.idle_timeout = std::chrono::seconds(options.idle_timeout_s);
  return limits;
}

HttpServer::HttpServer(HttpServerOptions options, EngineService& service, const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), service, tokenizer, this)) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  Impl& s = *impl_;
  if (s.started) return Status(StatusCode::kInternal, "HttpServer::start called twice");
  TESSERA_ASSIGN_OR_RETURN(s.limits, http_limits(s.options));
  s.api = make_api_context(s.tokenizer, s.options.model_name, s.service.max_model_len(), s.options.chat_renderer);
  s.api.max_model_len_limit = s.service.max_model_len_limit();
  beast::error_code ec;
  const auto address = asio::ip::make_address(s.options.host, ec);
  if (ec) return invalid_argument("server.http.host: '" + s.options.host + "' is not an IP address");
  if (s.options.port < 0 || s.options.port > 65535)
    return invalid_argument("server.http.port: " + std::to_string(s.options.port) + " is out of range");
  tcp::endpoint endpoint(address, static_cast<unsigned short>(s.options.port));
  s.acceptor.emplace(s.ioc);
  s.acceptor->open(endpoint.protocol(), ec);
  if (!ec) s.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor->bind(endpoint, ec);
  if (!ec) s.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(StatusCode::kUnavailable, "cannot listen on " + s.options.host + ":" +
                                                std::to_string(s.options.port) + ": " + ec.message());
  }
  s.port = s.acceptor->local_endpoint().port();
  s.work.emplace(asio::make_work_guard(s.ioc));
  s.accept();
  const int threads = std::max(1, s.options.threads);
  for (int i = 0; i < threads; ++i) s.threads.emplace_back([&s]() { s.ioc.run(); });
  s.started = true;
  return Status::ok();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::set_draining(bool draining) { impl_->draining = draining; }
bool HttpServer::draining() const { return impl_->draining; }

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.started = false;
  asio::post(s.ioc, [&s]() {
    beast::error_code ec;
    s.acceptor->close(ec);
  });
  std::vector<std::shared_ptr<HttpSession>> sessions;
  {
    std::lock_guard<std::mutex> lock(s.sessions_mu);
    for (auto& w : s.sessions)
      if (auto p = w.lock()) sessions.push_back(std::move(p));
  }
  for (auto& session : sessions)
    asio::post(session->shutdown_executor(), [session]() { session->shutdown(); });
  sessions.clear();
  {
    std::unique_lock<std::mutex> lock(s.sessions_mu);
    s.sessions_cv.wait_for(lock, s.limits.stop_grace, [&s]() { return s.live_sessions == 0; });
  }
  {
    std::lock_guard<std::mutex> lock(s.liveness->mu);
    s.liveness->alive = false;
  }
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

}  // namespace tessera
