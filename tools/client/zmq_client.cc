#include "tools/client/zmq_client.h"

#include <zmq.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>
#include <variant>

#include "common/wire/client_messages.h"

namespace tessera {

namespace wc = wire::client;

namespace {

// What a failed ZMTP handshake means to a user of this client. Only failures that end the
// connection for good are reported (libzmq drops the session after a protocol or
// authentication failure and does not reconnect, so every later send and receive would
// otherwise just block or time out).
std::string describe_handshake_failure(uint16_t event, uint32_t value, bool client_uses_curve) {
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
    return "the server refused this client (ZAP status " + std::to_string(value) + ")";
  switch (value) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return client_uses_curve
                 ? "this client encrypts with CURVE (a server public key was given) and the server does not: "
                   "drop the key, or turn on the server's server.curve.client_api"
                 : "the server encrypts its client API with CURVE (server.curve.client_api) and this client "
                   "has no server public key: give it the server's public key (--curve-server-key-file of "
                   "tessera-cli and tessera-loadgen)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
    case ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE:
      return "the CURVE exchange did not verify: is the server public key the server's?";
    default: {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", static_cast<unsigned>(value));
      return std::string("ZMTP protocol error ") + hex + " (is the endpoint a Tessera client API?)";
    }
  }
}

}  // namespace

struct ZmqClient::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  // Receives the dealer's handshake-failure events (inproc, so private to this context).
  zmq::socket_t monitor{ctx, zmq::socket_type::pair};
  bool monitoring = false;
  bool uses_curve = false;
  Status handshake_failed;  // set by the first fatal handshake failure; then every call returns it
  uint64_t next_id = 1;
  std::string api_key;
  std::string send_buf;

  // Reads the monitor's pending events, waiting up to `wait` for the first.
  void read_monitor(std::chrono::milliseconds wait) {
    if (!monitoring) return;
    try {
      zmq::pollitem_t item{monitor.handle(), 0, ZMQ_POLLIN, 0};
      if (wait.count() > 0) zmq::poll(&item, 1, wait);
      for (;;) {
        zmq::message_t event, endpoint;
        if (!monitor.recv(event, zmq::recv_flags::dontwait)) return;
        if (event.more()) (void)monitor.recv(endpoint);
        if (event.size() < 6 || !handshake_failed.is_ok()) continue;
        uint16_t id = 0;
        uint32_t value = 0;
        std::memcpy(&id, event.data(), 2);
        std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
        handshake_failed = invalid_argument("zmq client: the handshake with the server failed: " +
                                            describe_handshake_failure(id, value, uses_curve));
      }
    } catch (const zmq::error_t&) {
      // A broken monitor only costs the better message; the dealer's own errors still show.
    }
  }

  Status send(const std::string& frame) {
    read_monitor(std::chrono::milliseconds(0));
    if (!handshake_failed.is_ok()) return handshake_failed;
    try {
      // Unlimited HWM: a frame is queued even before the connection is up (ZeroMQ connects
      // lazily). It is refused only once the connection is gone for good, which is after a
      // failed handshake: wait a moment for the monitor to say which.
      if (!dealer.send(zmq::buffer(frame), zmq::send_flags::dontwait)) {
        read_monitor(std::chrono::milliseconds(1000));
        if (!handshake_failed.is_ok()) return handshake_failed;
        return Status(StatusCode::kUnavailable, "zmq client: the connection to the server is gone (send refused)");
      }
      return Status::ok();
    } catch (const zmq::error_t& e) {
      return Status(StatusCode::kUnavailable, std::string("zmq client: send failed: ") + e.what());
    }
  }
};

ZmqClient::ZmqClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ZmqClient::~ZmqClient() = default;

StatusOr<std::unique_ptr<ZmqClient>> ZmqClient::connect(const std::string& endpoint, ZmqClientOptions options) {
  if (endpoint.rfind("tcp://", 0) != 0 && endpoint.rfind("ipc://", 0) != 0)
    return invalid_argument("zmq client: expected an endpoint tcp://HOST:PORT or ipc://PATH, got '" + endpoint + "'");
  if (options.heartbeat_interval.count() < 1) return invalid_argument("zmq client: heartbeat_interval must be >= 1 ms");
  const std::string& key = options.curve_server_public_key;
  if (!key.empty()) {
    uint8_t raw[32];
    if (key.size() != 40 || zmq_z85_decode(raw, key.c_str()) == nullptr)
      return invalid_argument("zmq client: the CURVE server public key must be 40 Z85 characters");
    if (!zmq_has("curve")) return unimplemented("zmq client: CURVE key given but libzmq was built without CURVE");
  }
  auto impl = std::make_unique<Impl>();
  impl->api_key = options.api_key;
  try {
    zmq::socket_t& d = impl->dealer;
    d.set(zmq::sockopt::linger, 0);
    d.set(zmq::sockopt::sndhwm, 0);
    d.set(zmq::sockopt::rcvhwm, 0);
    const int ivl = static_cast<int>(options.heartbeat_interval.count());
    d.set(zmq::sockopt::heartbeat_ivl, ivl);
    d.set(zmq::sockopt::heartbeat_timeout, 3 * ivl);
    if (!key.empty()) {
      char pub[41], sec[41];
      if (zmq_curve_keypair(pub, sec) != 0) return internal_error("zmq client: zmq_curve_keypair failed");
      d.set(zmq::sockopt::curve_serverkey, key);
      d.set(zmq::sockopt::curve_publickey, std::string(pub, 40));
      d.set(zmq::sockopt::curve_secretkey, std::string(sec, 40));
      impl->uses_curve = true;
    }
    // Before connecting, so that no handshake goes unwatched.
    const char* monitor_address = "inproc://tessera-zmq-client-monitor";
    if (zmq_socket_monitor(d.handle(), monitor_address,
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
      impl->monitor.set(zmq::sockopt::linger, 0);
      impl->monitor.connect(monitor_address);
      impl->monitoring = true;
    }
    d.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return invalid_argument("zmq client: cannot connect to '" + endpoint + "': " + e.what());
  }
  return std::unique_ptr<ZmqClient>(new ZmqClient(std::move(impl)));
}

StatusOr<uint64_t> ZmqClient::submit(ZmqRequestKind kind, const std::string& request_json) {
  if (kind != ZmqRequestKind::kCompletion && kind != ZmqRequestKind::kChat && kind != ZmqRequestKind::kEmbeddings)
    return invalid_argument("zmq client: unknown request kind " + std::to_string(static_cast<int>(kind)));
  wc::Submit m;
  m.id = impl_->next_id++;
  m.kind = static_cast<wc::RequestKind>(kind);
  m.api_key = impl_->api_key;
  m.request_json = request_json;
  wc::encode(m, &impl_->send_buf);
  TESSERA_RETURN_IF_ERROR(impl_->send(impl_->send_buf));
  return m.id;
}

Status ZmqClient::abort(uint64_t request_id) {
  wc::encode(wc::Abort{request_id}, &impl_->send_buf);
  return impl_->send(impl_->send_buf);
}

StatusOr<ZmqClientEvent> ZmqClient::next_event(std::chrono::milliseconds timeout) {
  zmq::message_t msg;
  try {
    // Waits on the dealer and the monitor together: a failed handshake ends the wait at once.
    using std::chrono::milliseconds;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto handshake_failed = [&] {
      impl_->read_monitor(milliseconds(0));
      return !impl_->handshake_failed.is_ok();
    };
    bool received = false;
    do {
      if (handshake_failed()) return impl_->handshake_failed;
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      zmq::pollitem_t items[2] = {{impl_->dealer.handle(), 0, ZMQ_POLLIN, 0}, {impl_->monitor.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, impl_->monitoring ? 2 : 1, std::max(milliseconds(0), left));
      if (items[0].revents & ZMQ_POLLIN) received = impl_->dealer.recv(msg, zmq::recv_flags::dontwait).has_value();
    } while (!received && std::chrono::steady_clock::now() < deadline);
    if (!received) {
      if (handshake_failed()) return impl_->handshake_failed;
      return Status(StatusCode::kUnavailable,
                    "zmq client: timed out after " + std::to_string(timeout.count()) + " ms waiting for an event");
    }
    while (msg.more()) {  // the server sends single frames; keep the last of anything else
      zmq::message_t extra;
      if (!impl_->dealer.recv(extra, zmq::recv_flags::none)) break;
      msg = std::move(extra);
    }
  } catch (const zmq::error_t& e) {
    return Status(StatusCode::kUnavailable, std::string("zmq client: receive failed: ") + e.what());
  }
  TESSERA_ASSIGN_OR_RETURN(wc::Message m, wc::decode_message(std::string_view(static_cast<const char*>(msg.data()), msg.size())));
  ZmqClientEvent ev;
  if (auto* d = std::get_if<wc::Delta>(&m)) {
    ev.kind = ZmqClientEvent::Kind::kDelta;
    ev.request_id = d->id;
    ev.index = static_cast<int>(d->index);
    ev.text = std::move(d->text);
    ev.reasoning = std::move(d->reasoning);
    ev.token_ids = std::move(d->token_ids);
    ev.logprobs = std::move(d->logprobs);
  } else if (auto* f = std::get_if<wc::Final>(&m)) {
    ev.kind = ZmqClientEvent::Kind::kFinal;
    ev.request_id = f->id;
    ev.prompt_tokens = f->prompt_tokens;
    for (wc::FinalChoice& c : f->choices) {
      ev.finish_reasons.push_back(std::move(c.finish_reason));
      ev.completion_tokens.push_back(c.completion_tokens);
      ev.embeddings.push_back(std::move(c.embedding));
    }
  } else if (auto* e = std::get_if<wc::Error>(&m)) {
    ev.kind = ZmqClientEvent::Kind::kError;
    ev.request_id = e->id;
    ev.status = e->status;
    ev.error_type = std::move(e->type);
    ev.error_code = std::move(e->code);
    ev.error_param = std::move(e->param);
    ev.error_message = std::move(e->message);
  } else if (auto* r = std::get_if<wc::Reject>(&m)) {
    // The server speaks another protocol version: no request of ours can succeed.
    ev.kind = ZmqClientEvent::Kind::kError;
    ev.status = 400;
    ev.error_type = "invalid_request_error";
    ev.error_code = "unsupported_protocol_version";
    ev.error_message = std::move(r->reason);
  } else {
    return data_loss("zmq client: the server sent a client-to-server message");
  }
  return ev;
}

}  // namespace tessera
