#include "tools/loadgen/target_check.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "tools/client/http_client.h"

namespace tessera::loadgen {
namespace {

Status refuse(const std::string& what, const std::string& host) {
  return invalid_argument(what + ": host '" + host +
                          "' is not a loopback address; tessera-loadgen loads only this machine unless "
                          "--allow-remote is given");
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host.empty()) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  bool all_loopback = true;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) all_loopback = false;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      const bool v4_mapped_loopback = IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
      if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) && !v4_mapped_loopback) all_loopback = false;
    } else {
      all_loopback = false;
    }
  }
  freeaddrinfo(res);
  return all_loopback;
}

Status check_http_target(const std::string& url, bool allow_remote) {
  TESSERA_ASSIGN_OR_RETURN(HttpUrl parsed, parse_http_url(url));
  if (allow_remote || is_loopback_host(parsed.host)) return Status::ok();
  return refuse("--url " + url, parsed.host);
}

Status check_zmq_target(const std::string& endpoint, bool allow_remote) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return Status::ok();
  const std::string scheme = "tcp://";
  if (endpoint.rfind(scheme, 0) != 0) {
    return invalid_argument("--zmq '" + endpoint + "': expected tcp://HOST:PORT or ipc://PATH");
  }
  std::string hostport = endpoint.substr(scheme.size());
  std::string host;
  if (!hostport.empty() && hostport.front() == '[') {
    host = hostport.substr(1, hostport.find(']') - 1);
  } else {
    host = hostport.substr(0, hostport.rfind(':'));
  }
  // tcp://SRC;HOST:PORT names a source address first.
  if (const size_t semi = host.find(';'); semi != std::string::npos) host = host.substr(semi + 1);
  if (allow_remote || is_loopback_host(host)) return Status::ok();
  return refuse("--zmq " + endpoint, host);
}

}  // namespace tessera::loadgen
