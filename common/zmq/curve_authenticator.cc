#include "common/zmq/curve_authenticator.h"

#include <zmq.h>

#include <chrono>
#include <map>

#include "common/logging.h"

namespace tessera {
namespace {

std::string frame_text(zmq_msg_t& m) {
  return std::string(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
}

}  // namespace

CurveAuthenticator::~CurveAuthenticator() { stop(); }

Status CurveAuthenticator::start(void* ctx, std::vector<std::string> allowed, std::string what) {
  if (socket_ != nullptr) return internal_error("CurveAuthenticator started twice");
  allowed_ = std::set<std::string>(allowed.begin(), allowed.end());
  what_ = std::move(what);
  socket_ = zmq_socket(ctx, ZMQ_REP);
  if (socket_ == nullptr) return internal_error(std::string("ZAP handler socket: ") + zmq_strerror(zmq_errno()));
  int linger = 0;
  zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_bind(socket_, "inproc://zeromq.zap.01") != 0) {
    const std::string err = zmq_strerror(zmq_errno());
    zmq_close(socket_);
    socket_ = nullptr;
    return internal_error("cannot bind the ZAP handler (inproc://zeromq.zap.01): " + err);
  }
  stop_.store(false);
  thread_ = std::thread([this] { run(); });
  return Status::ok();
}

void CurveAuthenticator::stop() {
  if (socket_ == nullptr) return;
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  zmq_close(socket_);
  socket_ = nullptr;
}

void CurveAuthenticator::run() {
  std::map<std::string, std::chrono::steady_clock::time_point> last_logged;  // per refused key
  while (!stop_.load()) {
    zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0 || !(item.revents & ZMQ_POLLIN)) continue;
    // Request: version, request id, domain, address, routing id, mechanism, credentials...
    std::vector<std::string> frames;
    std::string curve_key;
    for (int more = 1; more;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, socket_, 0) < 0) {
        zmq_msg_close(&m);
        break;
      }
      if (frames.size() == 6 && zmq_msg_size(&m) == 32) {  // the CURVE client's public key, binary
        char z85[41] = {};
        zmq_z85_encode(z85, static_cast<const uint8_t*>(zmq_msg_data(&m)), 32);
        curve_key = z85;
      }
      frames.push_back(frame_text(m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (frames.size() < 6) continue;  // malformed: REP cannot answer a partial request
    const std::string& address = frames[3];
    const bool ok = frames[5] == "CURVE" && !curve_key.empty() && allowed_.count(curve_key) > 0;
    if (!ok) {
      refused_.fetch_add(1);
      auto now = std::chrono::steady_clock::now();
      auto it = last_logged.find(curve_key);
      if (it == last_logged.end() || now - it->second > std::chrono::seconds(10)) {
        last_logged[curve_key] = now;
        TESSERA_LOG_ERROR("{}: refused a {} client from {}: its public key {} is not in "
                          "server.curve.allowed_client_keys_file",
                          what_, frames[5], address.empty() ? "?" : address, curve_key.empty() ? "(none)" : curve_key);
      }
    }
    const std::string reply[] = {"1.0", frames[1], ok ? "200" : "400", ok ? "OK" : "public key not allowed",
                                 ok ? curve_key : "", ""};
    for (size_t i = 0; i < 6; ++i) {
      zmq_send(socket_, reply[i].data(), reply[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
    }
  }
}

}  // namespace tessera
