// Chaos on a real tessera-serve (tiny-llama, two ranks, 200 ms heartbeats) under mixed load:
// streaming and plain completions from six clients while, one after another, rank 1 is killed
// (kill -9), rank 0 is stopped for good (SIGSTOP, never continued), rank 0 is killed, and the
// whole server is restarted (SIGTERM drains it, a new one starts). Every request must end one
// of two ways: completed with the tokens of a fault-free run, or a clean retryable error (503
// with Retry-After, a stream ended by an error event, a refused connection while no server
// listens) — never a hang, never a 200 cut short without an error event.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/raw_http.h"
#include "tests/tools/raw_sse_stream.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kChaosTokens = 24;
constexpr int kChaosPrompts = 4;
constexpr int kRequestTimeoutS = 45;  // far past any wait the server imposes: longer is a hang

json chaos_request(int prompt, bool stream) {
  json ids = json::array();
  for (int k = 0; k < 3 + prompt; ++k) ids.push_back(11 + (prompt * 37 + k * 19) % 480);
  return {{"prompt", ids},          {"max_tokens", kChaosTokens}, {"temperature", 0},
          {"ignore_eos", true},     {"logprobs", 0},              {"stream", stream}};
}

json chaos_tokens(const json& body) {
  if (!body.contains("choices") || body["choices"].empty()) return json();
  return body["choices"][0]["logprobs"]["tokens"];
}

std::vector<std::string> chaos_server_args() {
  return {"--model", testing::fixtures_dir() + "/tiny-llama", "--tensor-parallel", "2", "--backend", "cpu",
          "--threads", "1", "--set", "cache.num_blocks=256", "--set", "server.heartbeat_ms=200", "--set",
          "server.heartbeat_misses=3", "--set", "server.worker_restart_wait_s=30", "--set",
          "server.drain_timeout_s=10"};
}

struct Tally {
  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> ok{0}, retryable{0}, refused{0};
  void fail(std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(std::move(what));
  }
};

// One plain completion: classified into the tally.
void plain_request(int port, int prompt, const json& reference, Tally& tally) {
  const std::string body = chaos_request(prompt, false).dump();
  const int fd = testing::connect_loopback(port);
  if (fd < 0) {
    ++tally.refused;  // no server listening (the restart)
    return;
  }
  testing::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: "
                        "application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body);
  bool closed = false;
  const std::string raw = testing::read_until_close(fd, std::chrono::seconds(kRequestTimeoutS), &closed);
  close(fd);
  if (!closed) return tally.fail("plain: no answer within " + std::to_string(kRequestTimeoutS) + " s (a hang)");
  if (raw.empty()) {
    ++tally.refused;  // reset before a byte of answer (the old server closing its listener)
    return;
  }
  const std::vector<testing::RawResponse> all = testing::split_responses(raw);
  if (all.size() != 1) return tally.fail("plain: not one whole response: " + raw.substr(0, 300));
  const testing::RawResponse& r = all[0];
  if (r.status == 200) {
    const json j = json::parse(r.body, nullptr, false);
    if (!j.is_discarded() && chaos_tokens(j) == reference) {
      ++tally.ok;
      return;
    }
    return tally.fail("plain: 200 with other tokens: " + r.body.substr(0, 300));
  }
  if (r.status == 503 && !r.header("retry-after").empty()) {
    ++tally.retryable;
    return;
  }
  tally.fail("plain: status " + std::to_string(r.status) + ": " + r.body.substr(0, 300));
}

// One streamed completion: classified into the tally.
void stream_request(int port, int prompt, const json& reference, Tally& tally) {
  const testing::RawSseStream s =
      testing::read_raw_sse(port, "/v1/completions", chaos_request(prompt, true).dump(), nullptr, kRequestTimeoutS);
  // Refused, or reset before a byte of answer (the old server closing its listener): the
  // request was never taken; a client tries again.
  if (s.transport_error == "connect failed" || (s.status == 0 && s.head.empty())) {
    ++tally.refused;
    return;
  }
  if (s.status == 503 && s.head.find("Retry-After") != std::string::npos) {
    ++tally.retryable;
    return;
  }
  bool error_event = false;
  const json tokens = testing::streamed_logprob_tokens(s, &error_event);
  if (s.status != 200 || !s.terminated || !s.transport_error.empty() || !s.framing_error.empty()) {
    return tally.fail("stream: status " + std::to_string(s.status) + ", cut (" + s.transport_error +
                      s.framing_error + "), " + std::to_string(s.events.size()) + " events");
  }
  if (error_event) {
    ++tally.retryable;
    return;
  }
  if (s.events.empty() || s.events.back() != "[DONE]" || tokens != reference) {
    return tally.fail("stream: whole but not the reference tokens: " + tokens.dump());
  }
  ++tally.ok;
}

double since_ms(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Polls /ready on `port` until it answers `status` (true) or `limit_ms` pass.
bool ready_is(int port, int status, double limit_ms) {
  const Clock::time_point start = Clock::now();
  while (since_ms(start) < limit_ms) {
    if (testing::http_status(testing::http(port, "GET", "/ready")) == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(ServeChaos, MixedLoadThroughRankKillsARankStopAndAServerRestartEndsEveryRequestWholeOrRetryable) {
  TESSERA_REQUIRE_FIXTURES();
  auto server = std::make_unique<testing::ServeProcess>();
  ASSERT_TRUE(server->start(chaos_server_args())) << server->log();
  std::atomic<int> port{server->port()};
  std::vector<json> reference(kChaosPrompts);
  for (int p = 0; p < kChaosPrompts; ++p) {
    const std::string r = testing::http(port, "POST", "/v1/completions", chaos_request(p, false).dump());
    ASSERT_EQ(testing::http_status(r), 200) << r;
    reference[p] = chaos_tokens(json::parse(testing::http_body(r)));
    ASSERT_EQ(reference[p].size(), static_cast<size_t>(kChaosTokens));
  }

  Tally tally;
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; !stop.load(); ++i) {
        const int prompt = (c + i) % kChaosPrompts;
        const int settled = tally.ok.load() + static_cast<int>(tally.failures.size());
        if (c % 2 == 0) {
          stream_request(port.load(), prompt, reference[prompt], tally);
        } else {
          plain_request(port.load(), prompt, reference[prompt], tally);
        }
        // After a retryable error, a pause before trying again (as a client backs off).
        if (tally.ok.load() + static_cast<int>(tally.failures.size()) == settled)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  // Each fault once the load has completed a few requests since the last one; then the group
  // (or server) must come back and serve again.
  auto settle = [&](const char* after) {
    const int at = tally.ok.load();
    const Clock::time_point start = Clock::now();
    while (tally.ok.load() < at + 6 && since_ms(start) < 60000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_GE(tally.ok.load(), at + 6) << "nothing completed after " << after << "\n" << server->log();
  };
  std::string report;
  settle("the start");
  // rank 1 killed, rank 0 stopped for good (never continued), rank 0 killed.
  for (const auto& [rank, sig, what] : std::vector<std::tuple<int, int, std::string>>{
           {1, SIGKILL, "rank 1 killed"}, {0, SIGSTOP, "rank 0 stopped"}, {0, SIGKILL, "rank 0 killed"}}) {
    const pid_t w = testing::worker_pid(*server, rank);
    ASSERT_GT(w, 0) << server->log();
    const Clock::time_point t = Clock::now();
    kill(w, sig);
    EXPECT_TRUE(ready_is(port, 503, 5000)) << what << ": never noticed\n" << server->log();
    EXPECT_TRUE(ready_is(port, 200, 60000)) << what << ": never back\n" << server->log();
    report += what + ": ready again after " + std::to_string(static_cast<int>(since_ms(t))) + " ms; ";
    settle(what.c_str());
  }
  // The server restarted: SIGTERM drains it, a new one takes over (on a port of its own).
  const Clock::time_point restart = Clock::now();
  EXPECT_EQ(server->stop(), 0) << server->log();
  auto next = std::make_unique<testing::ServeProcess>();
  ASSERT_TRUE(next->start(chaos_server_args())) << next->log();
  port.store(next->port());
  report += "server restarted in " + std::to_string(static_cast<int>(since_ms(restart))) + " ms; ";
  server = std::move(next);
  settle("the restart");
  stop.store(true);
  for (auto& t : clients) t.join();

  EXPECT_TRUE(tally.failures.empty()) << tally.failures.size() << " requests neither whole nor retryable; the first: "
                                      << (tally.failures.empty() ? "" : tally.failures[0]) << "\n"
                                      << server->log();
  std::cout << "[ REPORT   ] " << report << tally.ok.load() << " requests whole with the reference tokens, "
            << tally.retryable.load() << " clean retryable errors, " << tally.refused.load()
            << " refused or reset before an answer (no server listening), " << tally.failures.size()
            << " anything else"
            << std::endl;
}

}  // namespace
}  // namespace tessera
