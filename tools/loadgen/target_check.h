#pragma once
// The load generator only loads this machine unless told otherwise: a target whose host
// resolves to anything but loopback (127.0.0.0/8, ::1; "localhost") is refused without
// --allow-remote. ipc:// and inproc:// ZeroMQ endpoints are local.
#include <string>

#include "common/status.h"

namespace tessera::loadgen {

// True when every address `host` resolves to is a loopback address (false when it does not
// resolve).
bool is_loopback_host(const std::string& host);

// InvalidArgument naming the target and --allow-remote when it is not loopback.
Status check_http_target(const std::string& url, bool allow_remote);
Status check_zmq_target(const std::string& endpoint, bool allow_remote);

}  // namespace tessera::loadgen
