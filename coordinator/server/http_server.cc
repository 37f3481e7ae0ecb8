// HttpServer: the listener (accept, the connection cap, the back-off when file descriptors
// run out), the limits from the options, start, drain and stop. Each connection is an
// HttpSession (coordinator/server/http_session.h).
#include "coordinator/server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <mutex>

#include "common/logging.h"
#include "common/thread_priority.h"
#include "coordinator/api/api_submission.h"
#include "coordinator/server/http_server_impl.h"
#include "coordinator/server/http_session.h"

namespace tessera {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

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

}  // namespace

ApiError too_many_connections_error() {
  return api_error(503, "service_unavailable", "", "too many connections (server.http.max_connections)");
}

void HttpServer::Impl::add_session(const std::shared_ptr<HttpSession>& s, bool probe_only) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  ++live_sessions;
  if (probe_only) ++probe_sessions;
  std::erase_if(sessions, [](const std::weak_ptr<HttpSession>& w) { return w.expired(); });
  sessions.push_back(s);
}

void HttpServer::Impl::remove_session(bool probe_only) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  --live_sessions;
  if (probe_only) --probe_sessions;
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
      bool full = false, probe_only = false;
      {
        std::lock_guard<std::mutex> lock(sessions_mu);
        // Only this accept handler opens sessions, so the counts cannot grow before add_session.
        if (live_sessions - probe_sessions >= limits.max_connections) {
          probe_only = probe_sessions < limits.probe_reserve;
          full = !probe_only;
        }
      }
      if (full) {
        refuse_connection(std::move(socket));
      } else {
        auto session = std::make_shared<HttpSession>(*this, std::move(socket), probe_only);
        add_session(session, probe_only);
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
    const std::string body = error_body(too_many_connections_error());
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
                           s.options.tool_call_format, s.options.reasoning_format);
  s.cors = CorsPolicy(s.options.cors_origins);
  s.api.max_model_len_limit = s.service.max_model_len_limit();
  s.api.generation = s.options.generation;
  s.api.embeddings = s.options.embeddings;
  if (s.options.lora_adapters) s.api.lora_adapters = s.options.lora_adapters;
  if (!s.options.batch_dir.empty()) {
    TESSERA_ASSIGN_OR_RETURN(s.batches, BatchStore::open(s.options.batch_dir, s.service, s.api));
  }
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
  for (Impl::PrepPool* pool : {&s.prep_small, &s.prep_large}) {
    pool->work.emplace(asio::make_work_guard(pool->ioc));
    const bool large = pool == &s.prep_large;
    for (int i = 0; i < threads; ++i) {
      pool->threads.emplace_back([pool, large]() {
        if (large) lower_this_thread_priority();
        pool->ioc.run();
      });
    }
  }
  for (int i = 0; i < threads; ++i) s.threads.emplace_back([&s]() { s.ioc.run(); });
  s.started = true;
  return Status::ok();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::set_draining(bool draining) {
  impl_->draining = draining;
  // A batch would go on submitting its lines into the drain: it stops first (marked failed).
  if (draining && impl_->batches) impl_->batches->shut_down();
}
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
  // Requests still being prepared finish first: their results are posted to the io_context,
  // which must still run them (each finds its connection closed and drops it).
  for (Impl::PrepPool* pool : {&s.prep_small, &s.prep_large}) {
    pool->work.reset();
    for (auto& t : pool->threads) t.join();
    pool->threads.clear();
  }
  s.work.reset();
  s.ioc.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

}  // namespace tessera
