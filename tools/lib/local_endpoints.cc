#include "tools/lib/local_endpoints.h"

#include <string>

#include "common/logging.h"

namespace tessera {

void choose_free_local_endpoints(TesseraConfig& config) {
  std::string chosen;
  if (!config.gave("server.control")) {
    config.server.control = kFreeLocalEndpoint;
    chosen = "server.control";
  }
  if (!config.gave("server.zmq_client")) {
    config.server.zmq_client = kFreeLocalEndpoint;
    chosen += std::string(chosen.empty() ? "" : " and ") + "server.zmq_client";
  }
  if (!chosen.empty()) {
    TESSERA_LOG_INFO("{} not configured: binding a free port on 127.0.0.1 ({}); the ports are logged once bound",
                     chosen, kFreeLocalEndpoint);
  }
}

}  // namespace tessera
