#pragma once
// tessera-serve starts its own workers on this host, so its internal endpoints need not be
// fixed ports: server.control and server.zmq_client, when neither the file nor a --set gave
// them, bind a free port on 127.0.0.1 (tcp://127.0.0.1:*), and several servers share a host.
// A given endpoint is kept exactly. tessera-coordinator keeps the documented fixed defaults:
// its workers and clients elsewhere must know where to connect.
#include "common/config.h"

namespace tessera {

// The wildcard endpoint the defaults become.
inline constexpr const char* kFreeLocalEndpoint = "tcp://127.0.0.1:*";

// Rewrites the endpoints `config` did not give (TesseraConfig::gave) and logs which; the
// bound ports are logged once bound ("worker group: listening on ...", "zmq clients on ...").
void choose_free_local_endpoints(TesseraConfig& config);

}  // namespace tessera
