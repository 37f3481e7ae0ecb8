#include "coordinator/server/zmq_client_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/logging.h"
#include "common/wire/client_messages.h"
#include "coordinator/api/api_submission.h"

namespace tessera {

namespace wc = wire::client;

namespace {

// Frames this much larger than max_body_bytes are dropped by ZeroMQ itself (the connection
// is closed without an answer), so a hostile client cannot make us buffer gigabytes; a body
// just over the limit still fits in a frame and gets a proper 413.
constexpr int64_t kFrameSlackBytes = 1 << 20;

// stop(): how long replies already queued may take to reach their clients.
constexpr std::chrono::milliseconds kCloseFlush{2000};

// One engine event for choice `index` of the request with server-side serial `serial`.
struct QueuedEvent {
  uint64_t serial = 0;
  size_t index = 0;
  GenerateEvent event;
};

// Engine callbacks -> socket thread. Why an eventfd rather than an inproc PAIR: callbacks
// run on the engine thread, and also on whatever thread calls EngineService::drain_and_stop
// (requests that never started get their final event there); a ZeroMQ socket must only be
// used by one thread, so an inproc pair would need a socket (or a lock) per producer, and
// every event would be copied into a zmq message. An eventfd is one non-blocking write(2)
// from any thread, coalesces any number of wake-ups into one, and zmq_poll watches it beside
// the ROUTER. Callbacks hold this by shared_ptr, so a late event after stop() touches live
// memory and is dropped.
struct EventQueue {
  std::mutex mu;
  std::vector<QueuedEvent> events;
  bool closed = false;
  int fd = -1;

  EventQueue() : fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~EventQueue() {
    if (fd >= 0) ::close(fd);
  }
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof(one));  // EAGAIN only at 2^64-1: awake anyway
  }
  void push(QueuedEvent e) {
    bool was_empty = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) return;
      was_empty = events.empty();
      events.push_back(std::move(e));
    }
    // The socket thread resets the eventfd before it takes the queue, so a push onto a
    // non-empty queue is always seen by a take still to come: no write needed.
    if (was_empty) wake();
  }
  void reset() {
    uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(fd, &count, sizeof(count));
  }
  void take(std::vector<QueuedEvent>* out) {
    out->clear();
    std::lock_guard<std::mutex> lock(mu);
    out->swap(events);
  }
  void close_queue() {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    events.clear();
  }
};

std::string hex_of(const std::string& identity) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : identity) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// One client request (all its choices), owned by the socket thread.
struct ClientRequest {
  std::string identity;
  uint64_t client_id = 0;
  int prompt_tokens = 0;
  std::vector<RequestId> request_ids;  // one per prompt
  std::vector<bool> done;              // per choice
  std::vector<wc::FinalChoice> finals;
  int dimensions = 0;  // embeddings: as ApiRequest's
  bool normalize_embedding = true;
  int remaining = 0;
  // Chat on a reasoning model: where each choice's thoughts end (as the HTTP stream's).
  std::vector<std::unique_ptr<ReasoningStream>> reasoning;
  bool include_reasoning = true;
};

}  // namespace

struct ZmqClientServer::Impl {
  Impl(ZmqClientServerOptions o, EngineService& s, const Tokenizer* t)
      : options(std::move(o)), service(s), tokenizer(t) {
    if (!options.replies) options.replies = std::make_shared<ReplyCounter>();
  }

  // ---- socket thread ---------------------------------------------------------------------

  bool send_frame(const std::string& identity, const std::string& frame) {
    try {
      if (!router->send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
      return router->send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;  // EHOSTUNREACH: the client's connection is gone (ROUTER_MANDATORY)
    }
  }

  // Sends to a client; a failed send means the client is gone: abort all its requests.
  bool send_or_drop(const std::string& identity, const std::string& frame) {
    if (send_frame(identity, frame)) return true;
    client_gone(identity);
    return false;
  }

  void send_error(const std::string& identity, uint64_t id, const ApiError& e) {
    wc::Error m;
    m.id = id;
    m.status = static_cast<uint16_t>(e.http_status);
    m.type = e.type;
    m.code = e.code;
    m.param = e.param;
    m.message = e.message;
    wc::encode(m, &send_buf);
    options.replies->add(e.http_status);
    send_or_drop(identity, send_buf);
  }

  void abort_choices(ClientRequest& r) { abort_api_request(service, r.request_ids); }

  void forget(uint64_t serial) {
    auto it = requests.find(serial);
    if (it == requests.end()) return;
    by_client_id.erase({it->second.identity, it->second.client_id});
    requests.erase(it);
    live_count.store(requests.size(), std::memory_order_relaxed);
  }

  // Every request of `identity`, in client-id order.
  std::vector<uint64_t> serials_of(const std::string& identity) const {
    std::vector<uint64_t> out;
    for (auto it = by_client_id.lower_bound({identity, 0}); it != by_client_id.end() && it->first.first == identity;
         ++it)
      out.push_back(it->second);
    return out;
  }

  void client_gone(std::string identity) {  // a copy: the requests holding it are erased
    const std::vector<uint64_t> serials = serials_of(identity);
    if (serials.empty()) return;
    TESSERA_LOG_INFO("[coord] zmq client {} is gone; aborting its {} request(s)", hex_of(identity), serials.size());
    for (uint64_t serial : serials) {
      abort_choices(requests.at(serial));
      forget(serial);
    }
  }

  void on_submit(const std::string& identity, wc::Submit& s) {
    if (s.id == 0)
      return send_error(identity, 0, api_error(400, "invalid_request_error", "invalid_request_id",
                                               "request id 0 is reserved; use ids from 1", "id"));
    if (static_cast<int64_t>(s.request_json.size()) > options.max_body_bytes)
      return send_error(identity, s.id,
                        api_error(413, "invalid_request_error", "request_too_large",
                                  "request body exceeds " + std::to_string(options.max_body_bytes) + " bytes"));
    if (!api_key_accepted(options.api_keys, s.api_key))
      return send_error(identity, s.id, api_error(401, "invalid_request_error", "invalid_api_key",
                                                  "missing or invalid API key (set the Submit api_key)"));
    if (draining.load())
      return send_error(identity, s.id, api_error(503, "service_unavailable", "draining", "the server is draining"));
    if (by_client_id.count({identity, s.id}))
      return send_error(identity, s.id,
                        api_error(400, "invalid_request_error", "duplicate_request_id",
                                  "request id " + std::to_string(s.id) + " is already in flight on this connection",
                                  "id"));
    const ApiEndpoint endpoint = s.kind == wc::RequestKind::kChat         ? ApiEndpoint::kChatCompletions
                                 : s.kind == wc::RequestKind::kEmbeddings ? ApiEndpoint::kEmbeddings
                                                                          : ApiEndpoint::kCompletions;
    ApiRequest req;
    ApiError error;
    if (!parse_api_request(endpoint, s.request_json, api, &req, &error)) return send_error(identity, s.id, error);
    // Deltas carry each choice's tokens as they come: nothing here could rank choices at the
    // end, or carry the prompt's logprobs.
    if (req.best_of > req.n)
      return send_error(identity, s.id, bad_request("best_of", "'best_of' > 'n' is not supported on the ZeroMQ client API"));
    if (req.echo && req.logprobs >= 0)
      return send_error(identity, s.id,
                        bad_request("echo", "'echo' with 'logprobs' (prompt logprobs) is not supported on the ZeroMQ "
                                            "client API; use /v1/completions"));

    const uint64_t serial = next_serial++;
    ClientRequest r;
    r.identity = identity;
    r.client_id = s.id;
    for (const auto& p : req.requests) r.prompt_tokens += static_cast<int>(p->prompt.size());
    const size_t n = req.num_choices();
    r.done.assign(n, false);
    r.finals.assign(n, wc::FinalChoice{});
    r.dimensions = req.dimensions;
    r.normalize_embedding = req.normalize_embedding;
    r.remaining = static_cast<int>(n);
    if (req.reasoning) {
      for (size_t i = 0; i < n; ++i) r.reasoning.push_back(std::make_unique<ReasoningStream>(req.starts_in_reasoning, req.reasoning_format));
      r.include_reasoning = req.include_reasoning;
    }
    std::shared_ptr<EventQueue> q = queue;
    StatusOr<std::vector<RequestId>> ids =
        submit_api_request(service, req, [q, serial](size_t index, const GenerateEvent& ev) {
          q->push(QueuedEvent{serial, index, ev});
        });
    // On failure the prompts submitted so far were aborted; their late events find no request.
    if (!ids.is_ok()) return send_error(identity, s.id, api_error_of(ids.status()));
    r.request_ids = std::move(ids).value();
    requests.emplace(serial, std::move(r));
    by_client_id[{identity, s.id}] = serial;
    live_count.store(requests.size(), std::memory_order_relaxed);
    if (req.echo) {
      // As REST's echo: the prompt text first, as a delta without tokens.
      for (size_t i = 0; i < n; ++i) {
        wc::Delta d;
        d.id = s.id;
        d.index = static_cast<uint32_t>(i);
        d.text = req.prompt_texts[i / static_cast<size_t>(req.n)];
        wc::encode(d, &send_buf);
        if (!send_or_drop(identity, send_buf)) return;
      }
    }
  }

  void on_abort(const std::string& identity, const wc::Abort& a) {
    auto it = by_client_id.find({identity, a.id});
    if (it == by_client_id.end()) return;  // finished already (its Final is on the way) or never existed
    abort_choices(requests.at(it->second));  // each choice's "abort" event ends it with a Final
  }

  void on_frame(const std::string& identity, std::string_view frame) {
    StatusOr<wc::Header> header = wc::decode_header(frame);
    if (!header.is_ok()) {
      return send_error(identity, wc::peek_request_id(frame).value_or(0),
                        api_error(400, "invalid_request_error", "bad_frame", header.status().message()));
    }
    if (header->version != wc::kProtocolVersion) {
      wc::Reject reject;
      reject.reason = "client protocol version " + std::to_string(header->version) +
                      " is not supported (this server speaks version " + std::to_string(wc::kProtocolVersion) + ")";
      wc::encode(reject, &send_buf);
      send_or_drop(identity, send_buf);
      return;
    }
    Status st;
    if (header->type == wc::MessageType::kSubmit) {
      wc::Submit s;
      st = wc::decode(frame, &s);
      if (st.is_ok()) return on_submit(identity, s);
    } else if (header->type == wc::MessageType::kAbort) {
      wc::Abort a;
      st = wc::decode(frame, &a);
      if (st.is_ok()) return on_abort(identity, a);
    } else {
      st = invalid_argument(std::string("a client may send Submit or Abort, not ") +
                            wc::message_type_name(header->type));
    }
    send_error(identity, wc::peek_request_id(frame).value_or(0),
               api_error(400, "invalid_request_error", "bad_frame", st.message()));
  }

  void on_event(QueuedEvent& qe) {
    auto it = requests.find(qe.serial);
    if (it == requests.end()) return;  // failed, aborted for a gone client, or its submit failed
    ClientRequest& r = it->second;
    if (qe.index >= r.done.size() || r.done[qe.index]) return;
    const GenerateEvent& ev = qe.event;
    std::string text = ev.text, reasoning;
    if (!r.reasoning.empty()) {
      ReasoningDelta d = r.reasoning[qe.index]->feed(ev.text, /*last=*/ev.finished);
      text = std::move(d.content);
      if (r.include_reasoning) reasoning = std::move(d.reasoning);
    }
    if (!text.empty() || !reasoning.empty() || !ev.tokens.empty()) {
      wc::Delta d;
      d.id = r.client_id;
      d.index = static_cast<uint32_t>(qe.index);
      d.text = std::move(text);
      d.reasoning = std::move(reasoning);
      d.token_ids.reserve(ev.tokens.size());
      d.logprobs.reserve(ev.tokens.size());
      for (const SampledToken& t : ev.tokens) {
        d.token_ids.push_back(t.token);
        d.logprobs.push_back(t.logprob);
      }
      wc::encode(d, &send_buf);
      if (!send_or_drop(r.identity, send_buf)) return;  // r is gone now
    }
    if (!ev.finished) return;
    if (ev.finish_reason == FinishReason::kError) {
      // The whole request fails (as REST answers 500): the other choices are aborted.
      r.done[qe.index] = true;
      abort_choices(r);
      const std::string identity = r.identity;
      const uint64_t id = r.client_id;
      forget(qe.serial);
      // A lost worker rank is not the request's fault: 503, as REST answers it.
      return send_error(identity, id, generation_error(ev.error, ev.unavailable));
    }
    r.done[qe.index] = true;
    r.finals[qe.index] = wc::FinalChoice{api_finish_reason(ev.finish_reason), ev.completion_tokens, {}};
    if (!ev.embedding.empty())
      r.finals[qe.index].embedding = finish_embedding(ev.embedding, r.dimensions, r.normalize_embedding);
    if (--r.remaining > 0) return;
    wc::Final f;
    f.id = r.client_id;
    f.prompt_tokens = r.prompt_tokens;
    f.choices = std::move(r.finals);
    const std::string identity = r.identity;
    forget(qe.serial);
    wc::encode(f, &send_buf);
    options.replies->add(200);
    send_or_drop(identity, send_buf);
  }

  void drain_events() {
    queue->reset();
    queue->take(&taken);
    for (QueuedEvent& e : taken) on_event(e);
    taken.clear();
  }

  // Receives what has arrived (at most `budget` messages, so events are not starved).
  void drain_socket(int budget) {
    for (int k = 0; k < budget; ++k) {
      zmq::message_t identity, payload;
      if (!router->recv(identity, zmq::recv_flags::dontwait)) return;
      bool one_frame = identity.more() && router->recv(payload, zmq::recv_flags::none).has_value();
      while (payload.more()) {  // a multi-frame message is not ours: drain and refuse it
        zmq::message_t extra;
        if (!router->recv(extra, zmq::recv_flags::none)) break;
        one_frame = false;
        payload = std::move(extra);
      }
      const std::string who = identity.to_string();
      if (!one_frame) {
        send_error(who, 0, api_error(400, "invalid_request_error", "bad_frame",
                                     "a client message is exactly one frame (DEALER, no empty delimiter)"));
        continue;
      }
      on_frame(who, std::string_view(static_cast<const char*>(payload.data()), payload.size()));
    }
  }

  void run() {
    zmq::pollitem_t items[2] = {{router->handle(), 0, ZMQ_POLLIN, 0}, {nullptr, queue->fd, ZMQ_POLLIN, 0}};
    while (!stopping.load(std::memory_order_acquire)) {
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        TESSERA_LOG_ERROR("[coord] zmq client API: poll failed: {}", e.what());
        break;
      }
      try {
        if (items[0].revents & ZMQ_POLLIN) drain_socket(256);
        drain_events();
      } catch (const zmq::error_t& e) {
        TESSERA_LOG_ERROR("[coord] zmq client API: {}", e.what());
      }
    }
    // Stopping: deliver what the engine already said (e.g. the drain's aborts), then end
    // every request still live with 503 and abort it, so its KV blocks are freed.
    try {
      drain_events();
      std::vector<std::pair<std::string, uint64_t>> live;
      for (const auto& [key, serial] : by_client_id) live.push_back(key);
      for (const auto& [identity, id] : live) {
        auto it = by_client_id.find({identity, id});
        if (it == by_client_id.end()) continue;
        const uint64_t serial = it->second;
        abort_choices(requests.at(serial));
        forget(serial);
        send_error(identity, id, api_error(503, "service_unavailable", "draining", "the server is shutting down"));
      }
    } catch (const zmq::error_t&) {
    }
    queue->close_queue();
  }

  ZmqClientServerOptions options;
  EngineService& service;
  const Tokenizer* tokenizer;
  ApiContext api;
  zmq::context_t ctx{1};
  std::unique_ptr<zmq::socket_t> router;
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  std::thread thread;
  std::string bound;
  bool started = false;
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};
  std::atomic<size_t> live_count{0};

  // Socket thread only.
  uint64_t next_serial = 1;
  std::unordered_map<uint64_t, ClientRequest> requests;              // by serial
  std::map<std::pair<std::string, uint64_t>, uint64_t> by_client_id;  // (identity, client id) -> serial
  std::string send_buf;
  std::vector<QueuedEvent> taken;
};

ZmqClientServer::ZmqClientServer(ZmqClientServerOptions options, EngineService& service, const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), service, tokenizer)) {}

ZmqClientServer::~ZmqClientServer() { stop(); }

Status ZmqClientServer::start() {
  Impl& s = *impl_;
  if (s.started) return internal_error("ZmqClientServer::start called twice");
  if (s.queue->fd < 0) return internal_error(std::string("eventfd failed: ") + std::strerror(errno));
  const std::string& ep = s.options.endpoint;
  if (ep.rfind("tcp://", 0) != 0 && ep.rfind("ipc://", 0) != 0 && ep.rfind("inproc://", 0) != 0)
    return invalid_argument("server.zmq_client: expected tcp://HOST:PORT or ipc://PATH, got '" + ep + "'");
  if (s.options.heartbeat_interval.count() < 1) return invalid_argument("heartbeat_interval must be >= 1 ms");
  s.api = make_api_context(s.tokenizer, s.options.model_name, s.service.max_model_len(), s.options.chat_renderer,
                           std::nullopt, s.options.reasoning_format);
  s.api.tool_calls_out = false;  // replies carry text only: requests whose tool calls would be read are refused
  s.api.max_model_len_limit = s.service.max_model_len_limit();
  s.api.generation = s.options.generation;
  s.api.embeddings = s.options.embeddings;
  if (s.options.lora_adapters) s.api.lora_adapters = s.options.lora_adapters;
  const bool curve = !s.options.curve_server_secret_key.empty();
  if (curve && !zmq_has("curve")) return unimplemented("a CURVE key was given but libzmq was built without CURVE");
  try {
    s.router = std::make_unique<zmq::socket_t>(s.ctx, zmq::socket_type::router);
    s.router->set(zmq::sockopt::linger, 0);
    s.router->set(zmq::sockopt::router_mandatory, 1);
    s.router->set(zmq::sockopt::sndhwm, 0);  // a slow reader's deltas queue up rather than fail
    s.router->set(zmq::sockopt::rcvhwm, 0);
    s.router->set(zmq::sockopt::maxmsgsize, std::max<int64_t>(0, s.options.max_body_bytes) + kFrameSlackBytes);
    const int ivl = static_cast<int>(s.options.heartbeat_interval.count());
    s.router->set(zmq::sockopt::heartbeat_ivl, ivl);
    s.router->set(zmq::sockopt::heartbeat_timeout, 3 * ivl);
    s.router->set(zmq::sockopt::heartbeat_ttl, std::min(3 * ivl, 6553500));
    if (curve) {
      s.router->set(zmq::sockopt::curve_server, 1);
      s.router->set(zmq::sockopt::curve_secretkey, s.options.curve_server_secret_key);
    }
    s.router->bind(ep);
    s.bound = s.router->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    s.router.reset();
    if (e.num() == EADDRINUSE) return Status(StatusCode::kUnavailable, "server.zmq_client: cannot bind '" + ep + "': " + e.what());
    return invalid_argument("server.zmq_client: cannot bind '" + ep + "': " + e.what());
  }
  s.started = true;
  s.thread = std::thread([&s] { s.run(); });
  return Status::ok();
}

std::string ZmqClientServer::endpoint() const { return impl_->bound; }

void ZmqClientServer::stop() {
  Impl& s = *impl_;
  if (!s.started) return;
  s.started = false;
  s.stopping.store(true, std::memory_order_release);
  s.queue->wake();
  if (s.thread.joinable()) s.thread.join();
  // The last replies (Finals, the drain's 503s) may still sit in the socket's queues: with
  // linger 0 closing would drop them. Give them up to kCloseFlush to leave (closing the
  // context waits for that); a peer that is gone or does not read does not hold us longer.
  try {
    if (s.router) s.router->set(zmq::sockopt::linger, static_cast<int>(kCloseFlush.count()));
  } catch (const zmq::error_t&) {
  }
  s.router.reset();
  s.ctx.close();
}

void ZmqClientServer::set_draining(bool draining) { impl_->draining = draining; }
bool ZmqClientServer::draining() const { return impl_->draining; }

size_t ZmqClientServer::live_requests() const { return impl_->live_count.load(std::memory_order_relaxed); }

std::map<int, uint64_t> ZmqClientServer::reply_counts() const { return impl_->options.replies->snapshot(); }

}  // namespace tessera
