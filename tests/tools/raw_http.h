#pragma once
// Raw HTTP over a loopback socket for the tests of the HTTP front end's edges: bytes go out
// exactly as written (bad framings, missing Host, HEAD), and what comes back is read until
// the server closes or a timeout passes, then split into its responses.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace tessera::testing {

// A connected socket to 127.0.0.1:port (-1 on failure).
inline int connect_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes (closed = true) or `timeout` passes with nothing new.
inline std::string read_until_close(int fd, std::chrono::milliseconds timeout, bool* closed = nullptr) {
  std::string out;
  if (closed) *closed = false;
  char buf[8192];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return out;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (closed) *closed = true;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

// Sends `bytes` on a new connection and returns everything the server sent back.
inline std::string raw_exchange(int port, const std::string& bytes, bool* closed = nullptr,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "";
  send_all(fd, bytes);
  std::string out = read_until_close(fd, timeout, closed);
  close(fd);
  return out;
}

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lowercased names
  std::string body;                            // by Content-Length (none for HEAD / 204)
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

// The responses in `raw`, in order; a body is taken by Content-Length unless `no_bodies`
// (answers to HEAD). A chunked body is kept whole as the last response's body.
inline std::vector<RawResponse> split_responses(const std::string& raw, bool no_bodies = false) {
  std::vector<RawResponse> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t head_end = raw.find("\r\n\r\n", pos);
    if (head_end == std::string::npos || raw.compare(pos, 5, "HTTP/") != 0) break;
    RawResponse r;
    const size_t line_end = raw.find("\r\n", pos);
    r.status = std::atoi(raw.substr(pos + 9, 3).c_str());
    for (size_t l = line_end + 2; l < head_end;) {
      const size_t e = raw.find("\r\n", l);
      const std::string line = raw.substr(l, e - l);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        size_t v = colon + 1;
        while (v < line.size() && line[v] == ' ') ++v;
        r.headers[name] = line.substr(v);
      }
      l = e + 2;
    }
    pos = head_end + 4;
    const std::string cl = r.header("content-length");
    if (!no_bodies && r.status != 204 && r.status != 304) {
      if (!cl.empty()) {
        const size_t n = std::stoul(cl);
        r.body = raw.substr(pos, n);
        pos += n;
      } else {
        r.body = raw.substr(pos);
        pos = raw.size();
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tessera::testing
