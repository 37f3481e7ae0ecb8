// libFuzzer: the bytes of one TCP connection to the real HTTP server. One HttpServer (the
// real Boost.Beast front end, with its chat template renderer) in front of a real
// EngineService with the scripted executor and the kjv-llama tokenizer is started
// once; each input is written to a fresh loopback connection and the response read back.
//
// Per input: connect, write the bytes, read what comes back. While the server is answering
// (bytes arriving or the engine busy) the write side stays open, so generations run to the
// end; once it has been quiet for a moment the write side is shut down (the server sees EOF
// and closes). Everything is bounded: max_model_len caps max_tokens, the body limit is small,
// the queue is short, and a connection gets at most kReadDeadline.
//
// Invariants (a violation traps, so libFuzzer reports it with the input):
//  - what comes back is empty or a sequence of well-framed responses, each starting with
//    "HTTP/1.1 " (or "HTTP/1.0 " for an HTTP/1.0 request) and a 3-digit status; complete
//    JSON bodies and server-sent events parse as JSON (the last response may be cut short
//    when a generation was aborted);
//  - once the connection is closed and in-flight requests have finished, every KV block is
//    free again (within kIdleDeadline).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/step_executor.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/server/http_server.h"
#include "tests/scripted_executor.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kReadDeadline = milliseconds(4000);  // per connection
constexpr auto kQuiet = milliseconds(10);           // no bytes and an idle engine: shut down writes
constexpr auto kIdleDeadline = milliseconds(2000);  // for the KV blocks to come back

#define FUZZ_CHECK(cond, what)                                                                       \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      std::fprintf(stderr, "http_request_fuzzer: invariant failed: %s: %s (%s:%d)\n", what, #cond, \
                   __FILE__, __LINE__);                                                              \
      __builtin_trap();                                                                              \
    }                                                                                                \
  } while (0)

}  // namespace

// A refused plan (or any broken invariant of tests/scripted_executor.h) is a finding.
namespace testing {
void scripted_executor_violation(const std::string& what) {
  std::fprintf(stderr, "http_request_fuzzer: invariant failed: %s\n", what.c_str());
  __builtin_trap();
}
}  // namespace testing

namespace {

// Deterministic tokens (tests/scripted_executor.h, as in tests/coordinator/http_server_test.cc):
// mostly ordinary ids, every 17th the EOS id so stop handling and special-token skipping run too.
testing::TokenScript tokens_with_eos(int32_t eos) {
  return [eos](const testing::SampleRow& r) {
    if (eos >= 0 && (static_cast<int>(r.seq_id % 5) + r.index) % 17 == 16) return eos;
    return testing::ordinary_token(r.index);
  };
}

struct Server {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<testing::ScriptedExecutor> executor;
  std::unique_ptr<EngineService> service;
  std::unique_ptr<HttpServer> http;
};

std::string fixtures_dir() {
  const char* env = std::getenv("TESSERA_FIXTURES");
  return env != nullptr && *env != '\0' ? env : TESSERA_FIXTURES_DIR;
}

// Started once and never stopped (the process ends with libFuzzer).
Server* start_server() {
  init_logging("fuzz", spdlog::level::err);
  auto* s = new Server();
  const std::string dir = fixtures_dir() + "/kjv-llama";
  if (auto t = Tokenizer::load(dir); t.is_ok()) {
    s->tokenizer = std::move(t).value();
  } else {
    std::fprintf(stderr,
                 "http_request_fuzzer: no tokenizer at %s (%s); fuzzing with token-id prompts only "
                 "(set TESSERA_FIXTURES to the fixtures folder)\n",
                 dir.c_str(), t.status().to_string().c_str());
  }
  s->executor = std::make_unique<testing::ScriptedExecutor>(tokens_with_eos(s->tokenizer ? s->tokenizer->eos_id() : -1));
  EngineServiceOptions eo;
  eo.scheduler.block_size = 4;
  eo.scheduler.num_blocks = 48;  // fewer than a few full-length sequences: preemption runs too
  eo.scheduler.max_model_len = 64;
  eo.scheduler.max_num_seqs = 8;
  eo.scheduler.max_num_batched_tokens = 128;
  eo.max_queued_requests = 32;
  eo.vocab_size = s->tokenizer ? 0 : 1000;
  s->service = std::make_unique<EngineService>(eo, *s->executor, s->tokenizer.get());
  s->service->start();

  HttpServerOptions ho;
  ho.host = "127.0.0.1";
  ho.port = 0;
  ho.api_keys = {"sk-fuzz"};
  ho.max_body_bytes = 2048;
  ho.model_name = "kjv-llama";
  ho.threads = 2;
  ho.idle_timeout_s = 1;
  s->http = std::make_unique<HttpServer>(ho, *s->service, s->tokenizer.get());
  const Status st = s->http->start();
  if (!st.is_ok()) {
    std::fprintf(stderr, "http_request_fuzzer: cannot start the server: %s\n", st.to_string().c_str());
    std::abort();
  }
  return s;
}

Server& server() {
  static Server* s = start_server();
  return *s;
}

bool engine_idle(const EngineService& service, bool blocks_too) {
  const EngineServiceStats st = service.stats();
  return st.num_running == 0 && st.num_waiting == 0 && (!blocks_too || st.kv_blocks_free == st.kv_blocks_total);
}

// The server must accept every connection. A blocking connect() can be interrupted by
// libFuzzer's own timer signal (-timeout) before the handshake completes: EINTR is not the
// server's fault, so the handshake is then awaited (poll + SO_ERROR), as POSIX prescribes.
// A transient local shortage (EADDRNOTAVAIL: ephemeral ports in TIME_WAIT after thousands
// of connections a minute) is retried briefly.
int connect_to(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  int err = 0;
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    FUZZ_CHECK(fd >= 0, "socket()");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    err = errno;
    if (err == EINTR || err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int r;
      do {
        r = ::poll(&p, 1, 5000);
      } while (r < 0 && errno == EINTR);
      socklen_t len = sizeof(err);
      if (r > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return fd;
      if (r == 0) err = ETIMEDOUT;
    }
    ::close(fd);
    if (err != EADDRNOTAVAIL && err != EINTR) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  std::fprintf(stderr, "http_request_fuzzer: invariant failed: connect to the server: %s\n", std::strerror(err));
  __builtin_trap();
}

// Writes as much of `data` as the server takes (it may answer and close early).
void send_input(int fd, std::string_view data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size() && Clock::now() < deadline) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads until the server closes (or the deadline). The write side is shut down once nothing
// has arrived for kQuiet while the engine is idle: the server then finishes and closes.
std::string read_response(int fd, const EngineService& service, Clock::time_point deadline) {
  std::string raw;
  bool shut = false;
  Clock::time_point last = Clock::now();
  char buf[16384];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, 2);
    if (r > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        raw.append(buf, static_cast<size_t>(n));
        last = Clock::now();
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      break;  // EOF or reset: the server closed
    }
    if (!shut && Clock::now() - last >= kQuiet && engine_idle(service, false)) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
  }
  return raw;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The value of header `name` (lower case) in a lower-cased header block, or npos-marked "".
bool header_value(const std::string& headers, const std::string& name, std::string* value) {
  const std::string key = "\r\n" + name + ":";
  const size_t at = headers.find(key);
  if (at == std::string::npos) return false;
  size_t b = at + key.size();
  size_t e = headers.find("\r\n", b);
  if (e == std::string::npos) e = headers.size();
  while (b < e && headers[b] == ' ') ++b;
  *value = headers.substr(b, e - b);
  return true;
}

void check_json(std::string_view text, const char* what) { FUZZ_CHECK(nlohmann::json::accept(text), what); }

void check_events(std::string_view body) {
  size_t pos = 0;
  while (pos < body.size()) {
    FUZZ_CHECK(body.substr(pos, 6) == "data: ", "a server-sent event starts with 'data: '");
    const size_t end = body.find("\n\n", pos);
    FUZZ_CHECK(end != std::string_view::npos, "a server-sent event ends with a blank line");
    const std::string_view payload = body.substr(pos + 6, end - pos - 6);
    if (payload != "[DONE]") check_json(payload, "a server-sent event's data is JSON");
    pos = end + 2;
  }
}

void check_body(int status, const std::string& headers, std::string_view body) {
  std::string type;
  header_value(headers, "content-type", &type);
  if (type == "application/json") check_json(body, "a JSON response body parses");
  if (type == "text/event-stream") {
    FUZZ_CHECK(status == 200, "event streams are 200");
    check_events(body);
  }
}

// The bytes the server sent: complete responses must be well framed; the last may be cut.
void check_responses(std::string_view raw) {
  static constexpr std::string_view kShape = "HTTP/1.x ddd ";
  size_t pos = 0;
  while (pos < raw.size()) {
    const std::string_view rest = raw.substr(pos);
    for (size_t i = 0; i < std::min(rest.size(), kShape.size()); ++i) {
      const char c = rest[i];
      const bool ok = kShape[i] == 'x' ? (c == '0' || c == '1')
                      : kShape[i] == 'd' ? std::isdigit(static_cast<unsigned char>(c)) != 0
                                         : c == kShape[i];
      FUZZ_CHECK(ok, "a response starts with 'HTTP/1.1 ' and a 3-digit status");
    }
    if (rest.size() < kShape.size()) return;
    const int status = std::stoi(std::string(rest.substr(9, 3)));
    FUZZ_CHECK(status >= 100 && status <= 599, "the status is 100..599");
    const size_t head_end = rest.find("\r\n\r\n");
    if (head_end == std::string_view::npos) return;  // cut short
    const std::string headers = lower(rest.substr(0, head_end));
    size_t body_at = head_end + 4;
    if (status == 100) {
      pos += body_at;
      continue;
    }
    std::string value;
    if (header_value(headers, "transfer-encoding", &value)) {
      FUZZ_CHECK(value == "chunked", "the only transfer coding is chunked");
      std::string body;
      size_t p = body_at;
      for (;;) {
        const size_t eol = rest.find("\r\n", p);
        if (eol == std::string_view::npos) return;
        const std::string_view size_text = rest.substr(p, eol - p);
        FUZZ_CHECK(!size_text.empty() && size_text.size() <= 8 &&
                       std::all_of(size_text.begin(), size_text.end(),
                                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }),
                   "a chunk size is hex");
        const size_t size = std::stoul(std::string(size_text), nullptr, 16);
        p = eol + 2;
        if (size == 0) {
          if (rest.size() < p + 2) return;
          FUZZ_CHECK(rest.substr(p, 2) == "\r\n", "the last chunk ends with an empty trailer");
          p += 2;
          break;
        }
        if (rest.size() < p + size + 2) return;
        body.append(rest.substr(p, size));
        FUZZ_CHECK(rest.substr(p + size, 2) == "\r\n", "a chunk ends with CRLF");
        p += size + 2;
      }
      check_body(status, headers, body);
      pos += p;
    } else if (header_value(headers, "content-length", &value)) {
      FUZZ_CHECK(!value.empty() && value.size() <= 9 &&
                     std::all_of(value.begin(), value.end(),
                                 [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }),
                 "Content-Length is a number");
      const size_t length = std::stoul(value);
      if (rest.size() < body_at + length) return;
      check_body(status, headers, rest.substr(body_at, length));
      pos += body_at + length;
    } else {
      // HTTP/1.0 streaming: the body runs to the end of the connection.
      FUZZ_CHECK(rest.substr(0, 9) == "HTTP/1.0 ", "only HTTP/1.0 bodies are delimited by the close");
      return;
    }
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::server();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  Server& s = server();
  const Clock::time_point deadline = Clock::now() + kReadDeadline;
  const int fd = connect_to(s.http->port());
  send_input(fd, std::string_view(reinterpret_cast<const char*>(data), size), deadline);
  const std::string raw = read_response(fd, *s.service, deadline);
  ::close(fd);
  static const bool debug = std::getenv("TESSERA_FUZZ_DEBUG") != nullptr;
  if (debug) std::fprintf(stderr, "--- %zu bytes in, %zu bytes back:\n%.600s\n", size, raw.size(), raw.c_str());
  check_responses(raw);

  // The connection is gone: whatever it started finishes or is aborted, and its KV blocks
  // (prefix-cached ones count as free) come back.
  const Clock::time_point idle_by = Clock::now() + kIdleDeadline;
  while (!engine_idle(*s.service, true)) {
    if (Clock::now() > idle_by) {
      const EngineServiceStats st = s.service->stats();
      std::fprintf(stderr,
                   "http_request_fuzzer: invariant failed: KV blocks not all free %lld ms after the "
                   "connection closed (running %d, waiting %d, free %d of %d)\n",
                   static_cast<long long>(kIdleDeadline.count()), st.num_running, st.num_waiting,
                   st.kv_blocks_free, st.kv_blocks_total);
      __builtin_trap();
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  return 0;
}
