#pragma once
// ZeroMQ's ZAP handler (RFC 27) for one context: CURVE clients whose public key is not in the
// allowed list are refused during the handshake, before any message of theirs is read. The
// control plane uses it for server.curve.allowed_client_keys_file: holding the coordinator's
// public key is then not enough, a worker must also hold one of the allowed keypairs.
//
// Every CURVE server socket of the context consults it (ZeroMQ binds the handler per
// context at inproc://zeromq.zap.01), so the context should hold only the sockets it guards.
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace tessera {

class CurveAuthenticator {
 public:
  CurveAuthenticator() = default;
  ~CurveAuthenticator();  // stop()
  CurveAuthenticator(const CurveAuthenticator&) = delete;
  CurveAuthenticator& operator=(const CurveAuthenticator&) = delete;

  // `zmq_context` is the raw context (zmq::context_t::handle()); bind before the guarded
  // sockets accept connections. `what` names the socket in log lines ("worker group").
  Status start(void* zmq_context, std::vector<std::string> allowed_public_keys, std::string what);
  void stop();
  // Handshakes refused so far.
  uint64_t refused() const { return refused_.load(); }

 private:
  void run();
  void* socket_ = nullptr;
  std::set<std::string> allowed_;
  std::string what_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace tessera
