#include "coordinator/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "common/logging.h"
#include "coordinator/api_submission.h"
#include "coordinator/http_edges.h"
#include "coordinator/metrics.h"
#include "coordinator/tokenize_api.h"

namespace tessera {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Extra response headers: (name, value), set through Beast's fields.
using Headers = std::vector<std::pair<beast::string_view, std::string>>;

// Retry-After of every 503 and 429: the client may try again (elsewhere, when draining).
constexpr const char* kRetryAfterSeconds = "1";

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Methods each route answers (the Allow header of a 405 and of OPTIONS); "" = no such route.
const char* route_methods(const std::string& path) {
  if (path == "/health" || path == "/ready" || path == "/metrics" || path == "/v1/models") return "GET, HEAD";
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return "GET, HEAD";
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" || path == "/detokenize")
    return "POST";
  return "";
}

// How many file descriptors the process may still open for connections: its soft
// RLIMIT_NOFILE less those open now and a reserve for what it opens later (ZeroMQ sockets,
// log files, an overflowing accept). -1 when the limit is unknown or unlimited.
int connection_room_under_fd_limit() {
  constexpr int kReserve = 64;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return -1;
  std::error_code ec;
  int open_now = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++open_now;
  const int64_t room = static_cast<int64_t>(rl.rlim_cur) - open_now - kReserve;
  return static_cast<int>(std::clamp<int64_t>(room, 1, 1 << 30));
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
  // accept() failed for want of file descriptors: try again after a pause that doubles up
  // to 1 s (the listening socket stays readable, so retrying at once would spin).
  void back_off_accepting();
  // Past max_connections: a short 503 written without waiting, then close.
  void refuse_connection(tcp::socket socket);
  void add_session(const std::shared_ptr<HttpSession>& s);
  void remove_session(HttpSession* s);
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
  asio::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> accept_timer;  // the accept back-off
  std::chrono::milliseconds accept_backoff{0};     // the last pause; 0 after a good accept
  Clock::time_point last_fd_warning{};
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
  // From HttpServer::stop_gracefully (posted to the strand, so after every engine event
  // already posted here): finish what was started, flush every queued write (the last
  // chunk, `data: [DONE]`, the chunked terminator) and close; close at once when idle.
  void finish_and_close() {
    keep_alive_ = false;  // every answer from now on ends its connection
    if (closed_ || gen_) return;  // a generation closes the connection when it ends
    if (writing_) {
      after_write_ = AfterWrite::kClose;  // nothing else will be written: close after the flush
      return;
    }
    disconnect();  // between requests: nothing started, nothing to flush
  }
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
    bool unavailable = false;  // that error: the workers were unavailable (503, not 500)
    bool cut = false;          // a choice was aborted by the server (drain deadline): 503
  };

  // ---- reading -------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(server_.limits.max_body_bytes);
    parser_->header_limit(server_.limits.max_header_bytes);
    extra_headers_.clear();
    head_ = false;
    if (buffer_.size() > 0 || first_request_) return read_header();
    // Kept alive and nothing pipelined: up to idle_timeout for the next request to begin.
    stream_.expires_after(server_.limits.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->on_read_error(ec);
      self->buffer_.commit(n);
      self->read_header();
    });
  }

  // A new connection (from its accept) or a begun request has header_timeout to finish its
  // headers, so trickling headers cannot hold a connection for the idle timeout.
  void read_header() {
    first_request_ = false;
    stream_.expires_after(server_.limits.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Several fields of one name read as one comma-separated list (RFC 9110 5.3).
  static std::optional<std::string> joined_field(const http::request_parser<http::string_body>::value_type& req,
                                                 http::field name) {
    std::optional<std::string> out;
    for (auto [it, end] = req.equal_range(name); it != end; ++it) {
      if (out) *out += ", ";
      out = out.value_or("") + std::string(it->value());
    }
    return out;
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    auto& req = parser_->get();
    // CORS headers go on every answer to an allowed origin, errors included.
    if (auto origin = req.find(http::field::origin); origin != req.end()) {
      origin_ = std::string(origin->value());
      for (auto& h : server_.cors.response_headers(origin_)) extra_headers_.push_back(std::move(h));
    } else {
      origin_.clear();
    }
    RequestFraming framing;
    framing.version = req.version();
    framing.transfer_encoding = joined_field(req, http::field::transfer_encoding);
    framing.content_encoding = joined_field(req, http::field::content_encoding);
    framing.host_fields = static_cast<int>(req.count(http::field::host));
    std::vector<std::pair<std::string, std::string>> extra;
    if (std::optional<ApiError> refused = check_request_framing(framing, &extra)) {
      // The body is never read (it may not even be framed): answer and close.
      version_ = req.version() == 10 ? 10 : 11;
      keep_alive_ = false;
      for (auto& [name, value] : extra) extra_headers_.emplace_back(std::move(name), std::move(value));
      return send_error(*refused);
    }
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
    stream_.expires_after(server_.limits.idle_timeout);
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
    const char* allowed = route_methods(path);
    if (method == http::verb::options) return answer_options(req, path, allowed);
    // HEAD is GET without the body (RFC 9110 9.3.2): same status and headers.
    head_ = method == http::verb::head;
    auto route = [&](http::verb want, const char* allow) -> bool {
      if (method == want || (want == http::verb::get && head_)) return true;
      send_error(api_error(405, "invalid_request_error", "method_not_allowed",
                           "method " + std::string(req.method_string()) + " is not allowed on " + path),
                 {{"Allow", allow}});
      return false;
    };
    if (path == "/health") {
      if (!route(http::verb::get, allowed)) return;
      return send(200, "application/json",
                  server_.draining ? R"({"status":"draining"})" : R"({"status":"ok"})");
    }
    if (path == "/ready") {
      if (!route(http::verb::get, allowed)) return;
      const bool ready =
          !server_.draining && (!server_.owner->ready_check || server_.owner->ready_check());
      return send(ready ? 200 : 503, "application/json",
                  ready ? R"({"status":"ready"})" : R"({"status":"not ready"})");
    }
    if (path == "/metrics") {
      if (!route(http::verb::get, allowed)) return;
      return send(200, "text/plain; version=0.0.4; charset=utf-8",
                  render_metrics(server_.service.stats(), server_.options.model_name, server_.responses.snapshot(),
                                 server_.options.zmq_replies ? server_.options.zmq_replies->snapshot()
                                                             : std::map<int, uint64_t>{}));
    }
    if (*allowed == '\0') {
      return send_error(api_error(404, "invalid_request_error", "not_found", "no route for " + path));
    }
    const bool is_get = std::string_view(allowed) != "POST";
    if (!route(is_get ? http::verb::get : http::verb::post, allowed)) return;
    if (path == "/tokenize" || path == "/detokenize") {  // outside /v1, unguarded, as vLLM has them
      std::string out;
      ApiError error;
      const bool ok = path == "/tokenize" ? tokenize_body(server_.api, req.body(), &out, &error)
                                          : detokenize_body(server_.api, req.body(), &out, &error);
      return ok ? send(200, "application/json", std::move(out)) : send_error(error);
    }
    const bool is_models = path == "/v1/models";
    const bool is_chat = path == "/v1/chat/completions";
    if (!authorized(req)) {
      return send_error(api_error(401, "invalid_request_error", "invalid_api_key",
                                  "missing or invalid API key (send 'Authorization: Bearer <key>')"),
                        {{"WWW-Authenticate", "Bearer"}});
    }
    if (is_models) {
      return send(200, "application/json",
                  models_body(server_.options.model_name, server_.api.max_model_len, unix_now()));
    }
    if (is_get) {  // /v1/models/{id}
      std::string out;
      ApiError error;
      if (!model_card_body(server_.api, path.substr(std::string_view("/v1/models/").size()), unix_now(), &out, &error))
        return send_error(error);
      return send(200, "application/json", std::move(out));
    }
    if (server_.draining) {
      return send_error(api_error(503, "service_unavailable", "draining", "the server is draining"),
                        {{"Retry-After", kRetryAfterSeconds}});
    }
    start_generation(is_chat ? ApiEndpoint::kChatCompletions : ApiEndpoint::kCompletions, req.body());
  }

  // OPTIONS (RFC 9110 9.3.7): what the route allows; a CORS preflight from an allowed origin
  // also gets the Access-Control-* grant, one from any other origin a 403.
  void answer_options(const http::request<http::string_body>& req, const std::string& path, const char* allowed) {
    if (*allowed == '\0' && path != "*") {
      return send_error(api_error(404, "invalid_request_error", "not_found", "no route for " + path));
    }
    const std::string methods = *allowed == '\0' ? "GET, HEAD, POST, OPTIONS" : std::string(allowed) + ", OPTIONS";
    const bool preflight = !origin_.empty() && req.find(http::field::access_control_request_method) != req.end();
    if (preflight) {
      if (!server_.cors.allows(origin_)) {
        return send_error(api_error(403, "invalid_request_error", "origin_not_allowed",
                                    "origin '" + origin_ + "' is not in server.http.cors_origins"));
      }
      std::string asked;
      if (auto h = req.find(http::field::access_control_request_headers); h != req.end()) asked = std::string(h->value());
      extra_headers_.clear();  // the preflight grant replaces the plain CORS headers
      for (auto& h : server_.cors.preflight_headers(origin_, methods, asked)) extra_headers_.push_back(std::move(h));
    }
    send(204, "", "", {{"Allow", methods}});
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
      if (e.http_status == 429 || e.http_status == 503) return send_error(e, {{"Retry-After", kRetryAfterSeconds}});
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
    if (!ev.prompt_logprobs.empty()) out.prompt_logprobs = ev.prompt_logprobs;
    out.completion_tokens = ev.completion_tokens;
    if (ev.finished) {
      out.finish_reason = ev.finish_reason;
      if (ev.finish_reason == FinishReason::kError && g.error.empty()) {
        g.error = ev.error.empty() ? "generation failed" : ev.error;
        g.unavailable = ev.unavailable;
      }
      // A client's own abort (it disconnected) never reaches here: its generation is gone.
      // So this one was cut by the server: the drain deadline, or the engine stopping.
      if (ev.finish_reason == FinishReason::kAborted) g.cut = true;
    }
    if (g.request.stream) {
      if (ev.finished && ev.finish_reason == FinishReason::kError) {
        queue_chunk(sse_event(error_body(engine_error(g))));
      } else if (ev.finished && ev.finish_reason == FinishReason::kAborted) {
        // Never a bare cut: the client learns why this choice has no final chunk.
        queue_chunk(sse_event(error_body(cut_error())));
      } else {
        // echo + logprobs: the prompt's chunk waits for its logprobs, which come with the first event.
        if (echo_waits_for_logprobs(g.request) && !out.stream_echoed) {
          out.stream_echoed = true;
          queue_chunk(sse_event(stream_echo_body(g.request, g.id, g.created, static_cast<int>(index),
                                                 ev.prompt_logprobs, server_.tokenizer, &out.stream_text_offset)));
        }
        for (const std::string& chunk :
             stream_event_chunks(g.request, g.id, g.created, static_cast<int>(index), ev, server_.tokenizer, &out))
          queue_chunk(sse_event(chunk));
      }
    }
    if (!ev.finished) return;
    g.done[index] = true;
    if (--g.remaining > 0) return;
    finish_generation();
  }

  static bool echo_waits_for_logprobs(const ApiRequest& r) {
    return r.endpoint == ApiEndpoint::kCompletions && r.echo && r.logprobs >= 0;
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
      } else if (g.request.echo && !echo_waits_for_logprobs(g.request)) {
        queue_chunk(sse_event(stream_echo_body(g.request, g.id, g.created, static_cast<int>(i), {}, server_.tokenizer,
                                               &g.outputs[i].stream_text_offset)));
      }
    }
  }

  // The error object of a generation that failed in the engine: 503 when the workers were
  // unavailable (a lost rank; the client may retry), else 500.
  static ApiError engine_error(const Generation& g) {
    if (g.unavailable) return api_error(503, "service_unavailable", "workers_unavailable", g.error);
    return api_error(500, "server_error", "internal_error", g.error);
  }
  static ApiError cut_error() {
    return api_error(503, "service_unavailable", "draining",
                     "the server is shutting down and stopped this request before it finished");
  }

  void finish_generation() {
    std::unique_ptr<Generation> g = std::move(gen_);
    if (server_.draining) keep_alive_ = false;  // let the client reconnect elsewhere
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
      const ApiError e = engine_error(*g);
      if (e.http_status == 503) {
        send_error(e, {{"Retry-After", kRetryAfterSeconds}});
      } else {
        send_error(e);
      }
    } else if (g->cut) {
      send_error(cut_error(), {{"Retry-After", kRetryAfterSeconds}});
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
    if (!content_type.empty())
      res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
    for (const auto& [name, value] : extra_headers_) res.set(name, value);
    for (const auto& [name, value] : extra) res.set(name, beast::string_view(value));
    res.keep_alive(keep_alive);
    return res;
  }

  void send(int status, std::string_view content_type, std::string body, const Headers& extra = {}) {
    if (server_.draining) keep_alive_ = false;  // let the client reconnect elsewhere
    auto out = std::make_unique<Outgoing>(Outgoing::Kind::kResponse);
    out->response = make_response(status, content_type, keep_alive_, extra);
    out->response.body() = std::move(body);
    out->response.prepare_payload();  // Content-Length
    if (status == 204) {
      out->response.erase(http::field::content_length);  // RFC 9110 8.6: never on a 204
    } else if (head_) {  // the GET answer's headers, Content-Length included, without its body
      const size_t length = out->response.body().size();
      out->response.body().clear();
      out->response.content_length(length);
    }
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
  bool first_request_ = true;  // nothing read yet: header_timeout runs from the accept
  bool head_ = false;          // the current request is a HEAD
  std::string origin_;         // its Origin header ("" = none)
  // Headers every answer to the current request carries (CORS, Accept-Encoding of a 415).
  std::vector<std::pair<std::string, std::string>> extra_headers_;
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
    if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
        ec == asio::error::no_memory) {
      return back_off_accepting();
    }
    if (!ec) {
      accept_backoff = std::chrono::milliseconds(0);
      bool full = false;
      {
        std::lock_guard<std::mutex> lock(sessions_mu);
        full = live_sessions >= limits.max_connections;
      }
      if (full) {
        refuse_connection(std::move(socket));
      } else {
        auto session = std::make_shared<HttpSession>(*this, std::move(socket));
        add_session(session);
        asio::dispatch(session->shutdown_executor(), [session]() { session->start(); });
      }
    }
    accept();
  });
}

void HttpServer::Impl::back_off_accepting() {
  accept_backoff = std::clamp(accept_backoff * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  const Clock::time_point now = Clock::now();
  if (now - last_fd_warning > std::chrono::seconds(10)) {  // one line per 10 s, not one per retry
    last_fd_warning = now;
    TESSERA_LOG_WARN("[coord] http: out of file descriptors accepting a connection; pausing accepts up to {} ms "
                     "(raise the fd limit or lower server.http.max_connections)",
                     accept_backoff.count());
  }
  accept_timer->expires_after(accept_backoff);
  accept_timer->async_wait([this](beast::error_code ec) {
    if (ec || !acceptor->is_open()) return;
    accept();
  });
}

void HttpServer::Impl::refuse_connection(tcp::socket socket) {
  static const std::string kBusy = [] {
    const std::string body =
        R"json({"error":{"message":"too many connections (server.http.max_connections)",)json"
        R"json("type":"service_unavailable","param":null,"code":null}})json";
    return "HTTP/1.1 503 Service Unavailable\r\nServer: tessera\r\nContent-Type: application/json\r\n"
           "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  beast::error_code ec;
  socket.non_blocking(true, ec);
  socket.send(asio::buffer(kBusy.data(), kBusy.size()), 0, ec);  // fits any socket buffer; never waits
  responses.add(503);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

StatusOr<HttpLimits> http_limits(const HttpServerOptions& options) {
  if (options.max_body_bytes < 0)
    return invalid_argument("HttpServerOptions::max_body_bytes is " + std::to_string(options.max_body_bytes) +
                            ": must be >= 0");
  if (options.idle_timeout_s < 1)
    return invalid_argument("HttpServerOptions::idle_timeout_s is " + std::to_string(options.idle_timeout_s) +
                            ": must be >= 1");
  if (options.header_timeout_s < 1)
    return invalid_argument("HttpServerOptions::header_timeout_s is " + std::to_string(options.header_timeout_s) +
                            ": must be >= 1");
  if (options.max_connections < 0)
    return invalid_argument("HttpServerOptions::max_connections is " + std::to_string(options.max_connections) +
                            ": must be >= 0");
  HttpLimits limits;
  limits.max_body_bytes = static_cast<uint64_t>(options.max_body_bytes);
  limits.idle_timeout = std::chrono::seconds(options.idle_timeout_s);
  limits.header_timeout = std::chrono::seconds(options.header_timeout_s);
  const int room = connection_room_under_fd_limit();
  if (options.max_connections == 0) {
    limits.max_connections = room > 0 ? room : 10000;
  } else {
    limits.max_connections = options.max_connections;
    if (room > 0 && options.max_connections > room) {
      TESSERA_LOG_WARN("[coord] http: server.http.max_connections {} exceeds what the file-descriptor limit leaves "
                       "room for ({}); accepts will pause when descriptors run out",
                       options.max_connections, room);
    }
  }
  return limits;
}

HttpServer::HttpServer(HttpServerOptions options, EngineService& service, const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), service, tokenizer, this)) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  Impl& s = *impl_;
  if (s.started) return Status(StatusCode::kInternal, "HttpServer::start called twice");
  TESSERA_ASSIGN_OR_RETURN(s.limits, http_limits(s.options));
  s.api = make_api_context(s.tokenizer, s.options.model_name, s.service.max_model_len(), s.options.chat_renderer,
                           s.options.tool_call_format);
  s.cors = CorsPolicy(s.options.cors_origins);
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
  s.accept_timer.emplace(s.ioc);
  TESSERA_LOG_INFO("[coord] http: at most {} connections", s.limits.max_connections);
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

void HttpServer::Impl::close_acceptor() {
  asio::post(ioc, [this]() {
    beast::error_code ec;
    acceptor->close(ec);
    if (accept_timer) accept_timer->cancel();  // a pending accept back-off must not reopen it
  });
}

void HttpServer::Impl::post_to_sessions(void (HttpSession::*what)()) {
  std::vector<std::shared_ptr<HttpSession>> live;
  {
    std::lock_guard<std::mutex> lock(sessions_mu);
    for (auto& w : sessions)
      if (auto p = w.lock()) live.push_back(std::move(p));
  }
  for (auto& session : live) asio::post(session->shutdown_executor(), [session, what]() { ((*session).*what)(); });
}

bool HttpServer::Impl::wait_sessions_closed(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(sessions_mu);
  return sessions_cv.wait_for(lock, timeout, [this]() { return live_sessions == 0; });
}

void HttpServer::stop_gracefully() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.draining = true;
  s.close_acceptor();
  s.post_to_sessions(&HttpSession::finish_and_close);
  if (!s.wait_sessions_closed(s.limits.stop_grace)) {
    TESSERA_LOG_WARN("[coord] http: connections still open {} s after the drain; closing them",
                     s.limits.stop_grace.count());
  }
  stop();
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.started = false;
  s.close_acceptor();
  s.post_to_sessions(&HttpSession::shutdown);
  s.wait_sessions_closed(s.limits.stop_grace);
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
