#include "coordinator/server/http_session.h"

#include <optional>
#include <string>

#include "common/logging.h"

namespace tessera {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// Several fields of one name read as one comma-separated list (RFC 9110 5.3).
std::optional<std::string> joined_field(const http::request_parser<http::string_body>::value_type& req,
                                        http::field name) {
  std::optional<std::string> out;
  for (auto [it, end] = req.equal_range(name); it != end; ++it) {
    if (out) *out += ", ";
    out = out.value_or("") + std::string(it->value());
  }
  return out;
}

// A probe connection's request, by its head: GET or HEAD of /health, /ready or /metrics.
bool is_probe_request(const http::request_parser<http::string_body>::value_type& req) {
  if (req.method() != http::verb::get && req.method() != http::verb::head) return false;
  std::string_view path(req.target().data(), req.target().size());
  path = path.substr(0, path.find('?'));
  return path == "/health" || path == "/ready" || path == "/metrics";
}

}  // namespace

void HttpSession::start() {
  beast::error_code ec;
  stream_.socket().non_blocking(true, ec);  // for the MSG_PEEK disconnect probe
  stream_.socket().set_option(tcp::no_delay(true), ec);
  if (probe_only_) {
    // The stream's own deadline closes the socket when it passes, so the wait for a probe's
    // head is a timer that cancels the read instead: the 503 can still be written.
    probe_timer_.emplace(stream_.get_executor());
    probe_timer_->expires_after(server_.limits.probe_head_wait);
    probe_timer_->async_wait([self = shared_from_this()](beast::error_code timer_ec) {
      if (timer_ec || self->probe_head_in_ || self->closed_) return;
      self->probe_wait_over_ = true;
      self->stream_.cancel();  // the pending read ends with operation_aborted
    });
  }
  do_read();
}

void HttpSession::finish_and_close() {
  keep_alive_ = false;  // every answer from now on ends its connection
  // A generation closes the connection when it ends; a request being prepared gets its answer.
  if (closed_ || gen_ || preparing_) return;
  if (writing_) {
    after_write_ = AfterWrite::kClose;  // nothing else will be written: close after the flush
    return;
  }
  disconnect();  // between requests: nothing started, nothing to flush
}

// ---- reading ---------------------------------------------------------------------------

void HttpSession::do_read() {
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
void HttpSession::read_header() {
  first_request_ = false;
  stream_.expires_after(server_.limits.header_timeout);
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void HttpSession::on_header(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  auto& req = parser_->get();
  if (probe_only_) {
    probe_head_in_ = true;
    if (probe_timer_) probe_timer_->cancel();
    version_ = req.version() == 10 ? 10 : 11;
    if (!is_probe_request(req)) return refuse_as_full();  // its body is never read
  }
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

void HttpSession::read_body() {
  // A probe connection is one of a few: it may not hold its slot for the idle timeout.
  stream_.expires_after(probe_only_ ? server_.limits.header_timeout : server_.limits.idle_timeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void HttpSession::on_read_error(beast::error_code ec) {
  if (probe_wait_over_ && ec == asio::error::operation_aborted) return refuse_as_full();
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

void HttpSession::on_read(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  stream_.expires_never();
  http::request<http::string_body> req = parser_->release();
  version_ = req.version();
  keep_alive_ = req.keep_alive() && !probe_only_;  // a probe connection serves one request
  handle(req);
}

void HttpSession::refuse_as_full() {
  keep_alive_ = false;
  send_error(too_many_connections_error(), {{"Retry-After", kRetryAfterSeconds}});
}

// ---- writing ---------------------------------------------------------------------------

// A response to the current request: its HTTP version, Tessera's Server header, and a
// Connection header as Beast derives it from `keep_alive`.
HttpSession::Response HttpSession::make_response(int status, std::string_view content_type, bool keep_alive,
                                                 const Headers& extra) const {
  Response res;
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

void HttpSession::send(int status, std::string_view content_type, std::string body, const Headers& extra) {
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

void HttpSession::send_error(const ApiError& e, const Headers& extra) {
  send(e.http_status, "application/json", error_body(e), extra);
}

void HttpSession::queue_chunk(std::string event) {
  auto out = std::make_unique<Outgoing>(Outgoing::Kind::kEvent);
  out->event = std::move(event);
  enqueue(std::move(out));
}

void HttpSession::enqueue(std::unique_ptr<Outgoing> out) {
  if (closed_) return;
  queue_.push_back(std::move(out));
  if (!writing_) write_next();
}

void HttpSession::write_next() {
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

void HttpSession::on_written(beast::error_code ec) {
  if (ec || closed_) {
    writing_ = false;
    queue_.clear();
    return disconnect();
  }
  stream_.expires_never();  // a stream waits for its next event without a deadline
  queue_.pop_front();
  write_next();
}

void HttpSession::after_writes() {
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

void HttpSession::linger() {
  stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->stream_.close();
    self->linger();
  });
}

void HttpSession::disconnect() {
  abort_generation();
  if (probe_timer_) probe_timer_->cancel();  // its handler holds this session
  if (closed_) return;
  closed_ = true;
  if (!writing_) queue_.clear();  // an in-flight write still reads queue_.front()
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
}

}  // namespace tessera
