// HttpServer end to end: a tiny blocking HTTP client over a real loopback socket, against
// the real EngineService and the scripted executor (tests/scripted_executor.h), which
// returns deterministic tokens.
#include "coordinator/server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/scripted_executor.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using nlohmann::json;

// The model: token i of every sequence is ordinary_token(i), logprob -0.5, and the top
// logprobs asked for are the tokens of the next indices.
using testing::ordinary_token;

// ---- a tiny blocking client ----------------------------------------------------------------

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                         const std::string& extra_headers = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST")
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

struct Response {
  int status = 0;
  std::string headers;  // raw, lower-cased
  std::string body;     // de-chunked
};

std::string dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t len = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    out += raw.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

Response parse_response(const std::string& raw) {
  Response r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || head_end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, head_end);
  for (char& c : r.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.body = raw.substr(head_end + 4);
  if (r.headers.find("transfer-encoding: chunked") != std::string::npos) r.body = dechunk(r.body);
  return r;
}

// Sends one request (Connection: close) and reads the whole response.
Response http(int port, const std::string& method, const std::string& path, const std::string& body = "",
              const std::string& extra_headers = "") {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  send_all(fd, request_text(method, path, body, extra_headers));
  std::string raw;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return parse_response(raw);
}

// Sends `request` and returns every byte the server sends until it closes.
std::string exchange_raw(int port, const std::string& request) {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  send_all(fd, request);
  std::string raw;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return raw;
}

// The JSON payloads of "data: ..." events, "[DONE]" included as a string.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

// ---- fixture ---------------------------------------------------------------------------------

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto t = Tokenizer::load(::tessera::testing::fixtures_dir() + "/kjv-llama");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tokenizer_ = std::move(t).value();
  }
  void TearDown() override {
    if (server_) server_->stop();
    server_.reset();
    if (service_) service_->stop();
    service_.reset();
  }

  // run_engine = false leaves the engine stopped: submitted requests stay queued.
  void start(HttpServerOptions options = {}, int max_queued_requests = 1024, bool run_engine = true) {
    EngineServiceOptions eo;
    eo.scheduler.block_size = 16;
    eo.scheduler.num_blocks = 256;
    eo.scheduler.max_model_len = 512;
    eo.max_queued_requests = max_queued_requests;
    service_ = std::make_unique<EngineService>(eo, executor_, tokenizer_.get());
    if (run_engine) service_->start();
    options.port = 0;
    options.model_name = "kjv";
    server_ = std::make_unique<HttpServer>(options, *service_, tokenizer_.get());
    server_->ready_check = [this]() { return ready_.load(); };
    ASSERT_TRUE(server_->start().is_ok());
    ASSERT_GT(server_->port(), 0);
  }

  std::string expected_text(int n) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(ordinary_token(i));
    return tokenizer_->decode(ids, true);
  }

  int port() const { return server_->port(); }

  std::unique_ptr<Tokenizer> tokenizer_;
  testing::ScriptedExecutor executor_;
  std::unique_ptr<EngineService> service_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<bool> ready_{true};
};

TEST_F(HttpServerTest, CompletionNonStreaming) {
  start();
  Response r = http(port(), "POST", "/v1/completions", R"({"model": "kjv", "prompt": "In the beginning", "max_tokens": 5})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("content-type: application/json"), std::string::npos);
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "kjv");
  EXPECT_EQ(j["choices"][0]["text"], expected_text(5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], tokenizer_->encode("In the beginning", true).size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
}

TEST_F(HttpServerTest, CompletionNAndBatchAndEcho) {
  start();
  Response r = http(port(), "POST", "/v1/completions", R"({"prompt": ["a", "b"], "n": 2, "max_tokens": 3, "echo": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], std::string(i < 2 ? "a" : "b") + expected_text(3));
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
}

TEST_F(HttpServerTest, CompletionStreaming) {
  start();
  Response r = http(port(), "POST", "/v1/completions",
                    R"({"prompt": [1, 500, 600], "max_tokens": 6, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("content-type: text/event-stream"), std::string::npos);
  std::vector<std::string> events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expected_text(6));
  EXPECT_EQ(finish, "length");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
}

TEST_F(HttpServerTest, ChatNonStreamingAndStreaming) {
  start();
  const std::string msgs = R"("messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";
  Response r = http(port(), "POST", "/v1/chat/completions", "{" + msgs + R"(, "max_tokens": 4})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected_text(4));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

  Response s = http(port(), "POST", "/v1/chat/completions", "{" + msgs + R"(, "max_tokens": 4, "stream": true})");
  ASSERT_EQ(s.status, 200);
  std::vector<std::string> events = sse_payloads(s.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    if (c["choices"][0]["delta"].contains("content")) text += c["choices"][0]["delta"]["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expected_text(4));
  EXPECT_EQ(finish, "length");
}

TEST_F(HttpServerTest, ErrorStatuses) {
  HttpServerOptions o;
  o.max_body_bytes = 4096;
  start(o);
  Response bad = http(port(), "POST", "/v1/completions", R"({"prompt": "x", "temperature": "hot"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json::parse(bad.body)["error"]["param"], "temperature");

  Response badjson = http(port(), "POST", "/v1/completions", "{oops");
  EXPECT_EQ(badjson.status, 400);

  Response ctx = http(port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 1000})");
  EXPECT_EQ(ctx.status, 400);
  const std::string msg = json::parse(ctx.body)["error"]["message"];
  EXPECT_NE(msg.find("512"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1000"), std::string::npos) << msg;

  Response model = http(port(), "POST", "/v1/completions", R"({"model": "gpt-9", "prompt": "x"})");
  EXPECT_EQ(model.status, 404);
  EXPECT_EQ(json::parse(model.body)["error"]["code"], "model_not_found");

  Response big = http(port(), "POST", "/v1/completions", R"({"prompt": ")" + std::string(10000, 'a') + R"("})");
  EXPECT_EQ(big.status, 413);

  EXPECT_EQ(http(port(), "GET", "/v1/completions").status, 405);
  EXPECT_EQ(http(port(), "POST", "/v1/models", "{}").status, 405);
  EXPECT_EQ(http(port(), "GET", "/nope").status, 404);
  EXPECT_EQ(json::parse(http(port(), "GET", "/nope").body)["error"]["code"], "not_found");
}

TEST_F(HttpServerTest, ApiKeys) {
  HttpServerOptions o;
  o.api_keys = {"secret"};
  start(o);
  const std::string body = R"({"prompt": [1, 2], "max_tokens": 2})";
  Response none = http(port(), "POST", "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(json::parse(none.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(http(port(), "POST", "/v1/completions", body, "Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_EQ(http(port(), "POST", "/v1/completions", body, "Authorization: Bearer secret\r\n").status, 200);
  EXPECT_EQ(http(port(), "GET", "/v1/models").status, 401);
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);  // probes stay open
}

TEST_F(HttpServerTest, HealthReadyModelsDraining) {
  start();
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);
  EXPECT_EQ(http(port(), "GET", "/ready").status, 200);
  ready_ = false;
  EXPECT_EQ(http(port(), "GET", "/ready").status, 503);
  ready_ = true;
  Response m = http(port(), "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "kjv");
  server_->set_draining(true);
  EXPECT_EQ(http(port(), "POST", "/v1/completions", R"({"prompt": [1]})").status, 503);
  EXPECT_EQ(http(port(), "GET", "/ready").status, 503);
  server_->set_draining(false);
  EXPECT_EQ(http(port(), "POST", "/v1/completions", R"({"prompt": [1], "max_tokens": 1})").status, 200);
}

// The end of a drain, in the order tessera-serve runs it: set_draining (new requests: 503 +
// Retry-After), EngineService::drain_and_stop (short streams finish, long ones are cut at
// the deadline), then stop_gracefully. Every stream still gets everything the engine gave
// it: its final chunk, or an error event when cut, then [DONE] and the chunked terminator.
TEST_F(HttpServerTest, DrainThenStopGracefullyEndsEveryStreamWithDoneAndItsTerminator) {
  executor_.set_step_delay(std::chrono::milliseconds(2));
  start();
  constexpr int kStreams = 8;
  std::vector<std::string> raw(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    const int max_tokens = i % 2 == 0 ? 20 : 400;  // odd ones outlive the deadline
    const std::string body = json{{"prompt", {1, 2, 3 + i}}, {"max_tokens", max_tokens}, {"stream", true},
                                  {"ignore_eos", true}}
                                 .dump();
    clients.emplace_back([&, i, body] { raw[i] = exchange_raw(port(), request_text("POST", "/v1/completions", body)); });
  }
  // Every stream has reached the engine (running, waiting, or already done).
  for (int k = 0; k < 20000; ++k) {
    const EngineServiceStats st = service_->stats();
    if (st.num_running + st.num_waiting + static_cast<int>(st.requests_finished_length) >= kStreams) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->set_draining(true);
  const Response refused = http(port(), "POST", "/v1/completions", R"({"prompt": [1], "max_tokens": 1})");
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.headers.find("retry-after: 1"), std::string::npos) << refused.headers;
  EXPECT_NE(refused.headers.find("connection: close"), std::string::npos) << refused.headers;
  service_->drain_and_stop(std::chrono::milliseconds(300));
  server_->stop_gracefully();
  for (auto& t : clients) t.join();
  int cut = 0;
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    const std::string terminator = "data: [DONE]\n\n\r\n0\r\n\r\n";
    ASSERT_GE(raw[i].size(), terminator.size()) << raw[i];
    EXPECT_EQ(raw[i].substr(raw[i].size() - terminator.size()), terminator) << raw[i];
    const std::vector<std::string> events = sse_payloads(parse_response(raw[i]).body);
    ASSERT_GE(events.size(), 2u);
    const json last = json::parse(events[events.size() - 2]);
    if (last.contains("error")) {
      EXPECT_EQ(last["error"]["code"], "draining") << last.dump();
      ++cut;
    } else {
      EXPECT_EQ(last["choices"][0]["finish_reason"], "length") << last.dump();
    }
  }
  EXPECT_GE(cut, 1) << "no stream was cut by the deadline";
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequests) {
  start();
  const int fd = connect_to(port());
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt": [1, 2], "max_tokens": 2})";
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  for (int i = 0; i < 3; ++i) {
    send_all(fd, req);
    std::string raw;
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      ASSERT_GT(n, 0) << "request " << i;
      raw.append(buf, static_cast<size_t>(n));
      const size_t he = raw.find("\r\n\r\n");
      if (he == std::string::npos) continue;
      const size_t cl = raw.find("Content-Length: ");
      ASSERT_NE(cl, std::string::npos);
      const size_t len = std::stoul(raw.substr(cl + 16));
      if (raw.size() >= he + 4 + len) break;
    }
    EXPECT_EQ(parse_response(raw).status, 200);
  }
  ::close(fd);
}

double metric(const std::string& page, const std::string& series) {
  const size_t p = page.find("\n" + series + " ");
  if (p == std::string::npos) return -1;
  return std::stod(page.substr(p + series.size() + 2));
}

TEST_F(HttpServerTest, MetricsMatchWhatClientsSaw) {
  start();
  int completion_tokens = 0, prompt_tokens = 0;
  for (int i = 0; i < 3; ++i) {
    Response r = http(port(), "POST", "/v1/completions", R"({"prompt": "And God said", "max_tokens": )" + std::to_string(2 + i) + "}");
    ASSERT_EQ(r.status, 200);
    json j = json::parse(r.body);
    completion_tokens += j["usage"]["completion_tokens"].get<int>();
    prompt_tokens += j["usage"]["prompt_tokens"].get<int>();
  }
  Response m = http(port(), "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.headers.find("content-type: text/plain"), std::string::npos);
  const std::string& page = m.body;
  EXPECT_EQ(metric(page, R"(tessera:generation_tokens_total{model_name="kjv"})"), completion_tokens) << page;
  EXPECT_EQ(metric(page, R"(tessera:prompt_tokens_total{model_name="kjv"})"), prompt_tokens);
  EXPECT_EQ(metric(page, R"(tessera:request_success_total{model_name="kjv",finished_reason="length"})"), 3);
  EXPECT_EQ(metric(page, R"(tessera:e2e_request_latency_seconds_count{model_name="kjv"})"), 3);
  EXPECT_EQ(metric(page, R"(tessera:time_to_first_token_seconds_count{model_name="kjv"})"), 3);
  EXPECT_EQ(metric(page, R"(tessera:num_requests_running{model_name="kjv"})"), 0);
  EXPECT_EQ(metric(page, R"(tessera:kv_cache_usage_perc{model_name="kjv"})"), 0);
  EXPECT_EQ(metric(page, R"(tessera:http_responses_total{model_name="kjv",code="200"})"), 3);
  EXPECT_NE(page.find("# TYPE tessera:time_per_output_token_seconds histogram"), std::string::npos);
  EXPECT_NE(page.find("tessera:num_preemptions_total{"), std::string::npos);
  EXPECT_NE(page.find("tessera:prefix_cache_hits_total{"), std::string::npos);
}

TEST_F(HttpServerTest, DisconnectMidStreamFreesBlocks) {
  start();
  executor_.set_step_delay(std::chrono::milliseconds(5));
  const int fd = connect_to(port());
  ASSERT_GE(fd, 0);
  std::string prompt = "[1";
  for (int i = 0; i < 100; ++i) prompt += "," + std::to_string(200 + i);
  prompt += "]";
  send_all(fd, request_text("POST", "/v1/completions", R"({"prompt": )" + prompt + R"(, "max_tokens": 400, "stream": true})"));
  std::string raw;
  char buf[4096];
  while (sse_payloads(raw).size() < 3) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    raw.append(buf, static_cast<size_t>(n));
  }
  EngineServiceStats busy = service_->stats();
  EXPECT_LT(busy.kv_blocks_free, busy.kv_blocks_total);
  EXPECT_EQ(busy.num_running, 1);
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  EngineServiceStats s;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = service_->stats();
  } while ((s.kv_blocks_free != s.kv_blocks_total || s.num_running != 0) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << "blocks not freed within 1 s of the disconnect";
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.requests_aborted, 1u);
}

TEST_F(HttpServerTest, FiftyConcurrentStreamingClients) {
  start();
  constexpr int kClients = 50;
  std::vector<std::thread> clients;
  std::atomic<int> good{0};
  const std::string want = expected_text(20);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c]() {
      Response r = http(port(), "POST", "/v1/completions",
                        R"({"prompt": [1, )" + std::to_string(300 + c) + R"(], "max_tokens": 20, "stream": true})");
      std::vector<std::string> ev = sse_payloads(r.body);
      if (r.status != 200 || ev.empty() || ev.back() != "[DONE]") return;
      std::string text;
      for (size_t i = 0; i + 1 < ev.size(); ++i) text += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
      if (text == want) ++good;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(good.load(), kClients);
  EngineServiceStats s = service_->stats();
  EXPECT_EQ(s.requests_finished_length, static_cast<uint64_t>(kClients));
}

// The bytes on the wire, as HTTP/1.1 and HTTP/1.0 clients expect them: status line, headers,
// Content-Length, the chunked framing of a stream and its last chunk.
TEST_F(HttpServerTest, ResponsesAndStreamsAreFramedAsHttp) {
  start();
  const std::string health = exchange_raw(port(), request_text("GET", "/health", ""));
  ASSERT_EQ(health.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << health;
  const std::string body = R"({"status":"ok"})";
  for (const std::string& h : {std::string("Server: tessera\r\n"), std::string("Content-Type: application/json\r\n"),
                               std::string("Connection: close\r\n"),
                               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body})
    EXPECT_NE(health.find(h), std::string::npos) << h << " in " << health;

  const std::string stream_body = R"({"prompt": [1, 500], "max_tokens": 3, "stream": true})";
  const std::string chunked = exchange_raw(port(), request_text("POST", "/v1/completions", stream_body));
  ASSERT_EQ(chunked.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << chunked;
  EXPECT_NE(chunked.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << chunked;
  EXPECT_NE(chunked.find("Content-Type: text/event-stream\r\n"), std::string::npos) << chunked;
  EXPECT_NE(chunked.find("Cache-Control: no-cache\r\n"), std::string::npos) << chunked;
  ASSERT_TRUE(chunked.ends_with("\r\n0\r\n\r\n")) << chunked;  // the last chunk
  const std::vector<std::string> events = sse_payloads(parse_response(chunked).body);
  ASSERT_GE(events.size(), 2u) << chunked;  // the tokens, then [DONE]
  EXPECT_EQ(events.back(), "[DONE]");
  // Every event is its own chunk: its size line, then exactly its bytes.
  const std::string done_chunk = std::string("e\r\n") + std::string(kSseDone) + "\r\n";
  EXPECT_NE(chunked.find(done_chunk), std::string::npos) << chunked;

  // HTTP/1.0 has no chunks: the events are the body, which ends when the server closes.
  const std::string old = exchange_raw(port(), "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                                               "Content-Length: " + std::to_string(stream_body.size()) + "\r\n\r\n" +
                                               stream_body);
  ASSERT_EQ(old.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << old;
  EXPECT_EQ(old.find("Transfer-Encoding"), std::string::npos) << old;
  EXPECT_TRUE(old.ends_with(kSseDone)) << old;
  const std::vector<std::string> old_events = sse_payloads(old.substr(old.find("\r\n\r\n") + 4));
  ASSERT_GE(old_events.size(), 2u) << old;
  EXPECT_EQ(old_events.back(), "[DONE]");
}

TEST_F(HttpServerTest, ExpectContinueIsAnsweredBeforeTheBody) {
  start();
  const int fd = connect_to(port());
  ASSERT_GE(fd, 0);
  const std::string body = R"({"prompt": [1, 2], "max_tokens": 2})";
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n");
  std::string raw;
  char buf[4096];
  while (raw.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    raw.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(raw, "HTTP/1.1 100 Continue\r\n\r\n");  // nothing else until the body comes
  send_all(fd, body);
  raw.clear();
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  Response r = parse_response(raw);
  EXPECT_EQ(r.status, 200) << raw;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 2);
}

TEST_F(HttpServerTest, FullQueueIs429WithRetryAfter) {
  start({}, /*max_queued_requests=*/2, /*run_engine=*/false);  // the queue only fills
  // Two prompts are two requests and fill the queue of two (their answer never comes: the
  // engine does not run); a third request then finds it full. (Three prompts in one call
  // could never be queued: that is a 400, ServeAdmission tests it.)
  const int filler = connect_to(port());
  ASSERT_GE(filler, 0);
  const std::string body = R"({"prompt": [[1, 2], [3, 4]], "max_tokens": 2})";
  send_all(filler, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body);
  while (service_->stats().num_waiting < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Response r = http(port(), "POST", "/v1/completions", R"({"prompt": [5, 6], "max_tokens": 2})");
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.headers.find("retry-after: 1"), std::string::npos) << r.headers;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "queue_full");
  ::close(filler);
}

TEST(HttpLimitsTest, OptionsMapToLimitsOnceAndOutOfRangeOnesAreNamed) {
  HttpServerOptions o;
  o.max_body_bytes = 4096;
  o.idle_timeout_s = 7;
  StatusOr<HttpLimits> l = http_limits(o);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_EQ(l->max_body_bytes, 4096u);
  EXPECT_EQ(l->idle_timeout, std::chrono::seconds(7));
  EXPECT_EQ(l->write_timeout, HttpLimits{}.write_timeout);
  o.idle_timeout_s = 0;
  EXPECT_NE(http_limits(o).status().message().find("idle_timeout_s"), std::string::npos);
  o.idle_timeout_s = 1;
  o.max_body_bytes = -1;
  EXPECT_NE(http_limits(o).status().message().find("max_body_bytes"), std::string::npos);
}

}  // namespace
}  // namespace tessera
