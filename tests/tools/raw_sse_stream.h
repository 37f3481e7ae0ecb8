#pragma once
// One streaming completion read over a raw loopback socket, byte for byte as the server
// sent it, until the server closes the connection: the chunked framing is decoded here (not
// by a client library that may forgive a missing terminator), so a stream that lost its
// `data: [DONE]` or its last chunk is seen for what it is.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace tessera::testing {

struct RawSseStream {
  std::string transport_error;  // connect/read failure ("" = read to the server's close)
  std::string head;             // status line and headers
  int status = 0;
  bool chunked = false;
  bool terminated = false;           // the zero-size last chunk and its CRLF arrived
  std::string framing_error;         // a malformed chunk
  std::vector<std::string> events;   // the payload of each `data: ` event, in order
};

// Decodes what `raw` holds (a whole HTTP/1.1 response) into `out`.
inline void parse_raw_sse(const std::string& raw, RawSseStream* out) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    out->framing_error = "no complete response head";
    return;
  }
  out->head = raw.substr(0, head_end + 2);
  if (out->head.rfind("HTTP/1.1 ", 0) == 0) out->status = std::atoi(out->head.c_str() + 9);
  out->chunked = out->head.find("Transfer-Encoding: chunked") != std::string::npos;
  std::string body;
  size_t at = head_end + 4;
  if (!out->chunked) {
    body = raw.substr(at);
  } else {
    for (;;) {
      const size_t line_end = raw.find("\r\n", at);
      if (line_end == std::string::npos) break;  // cut inside a size line
      const size_t size = std::strtoul(raw.substr(at, line_end - at).c_str(), nullptr, 16);
      const size_t data = line_end + 2;
      if (size == 0) {
        out->terminated = raw.compare(data, 2, "\r\n") == 0;
        if (out->terminated && data + 2 != raw.size()) out->framing_error = "bytes after the last chunk";
        break;
      }
      if (data + size + 2 > raw.size()) break;  // cut inside a chunk
      if (raw.compare(data + size, 2, "\r\n") != 0) {
        out->framing_error = "a chunk does not end with CRLF";
        break;
      }
      body.append(raw, data, size);
      at = data + size + 2;
    }
  }
  for (size_t p = 0; p < body.size();) {
    const size_t end = body.find("\n\n", p);
    if (end == std::string::npos) {
      if (body.find_first_not_of("\r\n", p) != std::string::npos) out->framing_error = "an unterminated event";
      break;
    }
    const std::string event = body.substr(p, end - p);
    if (event.rfind("data: ", 0) == 0) out->events.push_back(event.substr(6));
    p = end + 2;
  }
}

// POSTs `body` to `path` (Connection: close) and reads until the server closes.
// `first_event` (may be null) is set once the first `data: ` bytes have arrived; `reads`
// (may be null) gets the time each read returned bytes, for a stream's pace.
inline RawSseStream read_raw_sse(int port, const std::string& path, const std::string& body,
                                 std::atomic<bool>* first_event = nullptr, int timeout_s = 120,
                                 std::vector<std::chrono::steady_clock::time_point>* reads = nullptr) {
  RawSseStream out;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    out.transport_error = "connect failed";
    if (first_event) first_event->store(true);
    return out;
  }
  const std::string req = "POST " + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                          "Content-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!write(fd, req.data(), req.size());
  std::string raw;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      out.transport_error = "read failed (timeout or reset) after " + std::to_string(raw.size()) + " bytes";
      break;
    }
    raw.append(buf, static_cast<size_t>(n));
    if (reads) reads->push_back(std::chrono::steady_clock::now());
    if (first_event && raw.find("data: ") != std::string::npos) first_event->store(true);
  }
  close(fd);
  if (first_event) first_event->store(true);  // never leave a waiter hanging
  parse_raw_sse(raw, &out);
  return out;
}

// The token ids of choice 0's logprobs ("token_id:N" strings) over a stream's events, in
// order; *error_event is set when an event carried an error.
inline nlohmann::json streamed_logprob_tokens(const RawSseStream& s, bool* error_event) {
  nlohmann::json tokens = nlohmann::json::array();
  *error_event = false;
  for (const std::string& e : s.events) {
    const nlohmann::json j = nlohmann::json::parse(e, nullptr, false);
    if (!j.is_discarded() && j.contains("error")) *error_event = true;
    if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
    for (const nlohmann::json& t : j["choices"][0]["logprobs"]["tokens"]) tokens.push_back(t);
  }
  return tokens;
}

}  // namespace tessera::testing
