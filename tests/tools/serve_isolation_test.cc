// One client's heavy requests do not take the server from the others, on a real tessera-serve
// (kjv-llama): while three 10 MB /tokenize requests and four streams under a catastrophic
// regular expression (((.|\n)*){100}, whose masks take seconds) run, /health keeps answering
// within 100 ms and another client's stream keeps its pace. Before, /health waited up to 17 s
// behind the tokenizations (they ran on the I/O threads) and the stream's tokens 2.2 s apart
// behind the masks (every step waited for every mask).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/raw_sse_stream.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// A plain stream's whole time (ms) from request to [DONE], and the tokens it got.
struct StreamTiming {
  double total_ms = 0;
  double first_ms = 0;    // to the first bytes of the response
  double longest_gap_ms = 0;  // between two reads after that
  size_t chunks = 0;
  bool whole = false;
};

StreamTiming timed_stream(int port, int max_tokens) {
  const json body = {{"prompt", "In the beginning"}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                     {"temperature", 0}, {"stream", true}};
  const Clock::time_point start = Clock::now();
  std::vector<Clock::time_point> reads;
  const testing::RawSseStream s = testing::read_raw_sse(port, "/v1/completions", body.dump(), nullptr, 120, &reads);
  StreamTiming t;
  t.total_ms = ms_between(start, Clock::now());
  if (!reads.empty()) t.first_ms = ms_between(start, reads.front());
  for (size_t i = 1; i < reads.size(); ++i) t.longest_gap_ms = std::max(t.longest_gap_ms, ms_between(reads[i - 1], reads[i]));
  t.chunks = s.events.size();
  t.whole = s.status == 200 && s.terminated && !s.events.empty() && s.events.back() == "[DONE]";
  return t;
}

TEST(ServeIsolation, HealthAndOtherStreamsKeepTheirPaceBesideHugeTokenizationsAndCostlyGrammars) {
  TESSERA_REQUIRE_FIXTURES();
  // A pace measured against a 10 MB tokenization that the sanitizers make minutes long says
  // nothing about the release build; the release pass measures it.
  if (testing::kSanitizedBuild) GTEST_SKIP() << "SKIPPED: a timing comparison, run in the release build";
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--backend", "cpu", "--threads", "1",
                            "--set", "cache.num_blocks=512", "--set", "server.http.max_body_bytes=33554432"}))
      << server.log();
  const int port = server.port();
  constexpr int kStreamTokens = 200;
  timed_stream(port, kStreamTokens);  // warm
  const StreamTiming unloaded = timed_stream(port, kStreamTokens);
  ASSERT_TRUE(unloaded.whole);

  // 10 MB of text per /tokenize.
  const std::string verse = "And God said, Let there be light: and there was light. ";
  std::string text;
  while (text.size() < (size_t{10} << 20)) text += verse;
  const std::string tokenize_body = json{{"prompt", text}}.dump();

  std::atomic<bool> stop{false};
  std::atomic<int> tokenized{0}, heavy_done{0};
  std::vector<std::thread> load;
  for (int i = 0; i < 3; ++i) {
    load.emplace_back([&] {
      while (!stop.load()) {
        const std::string r = testing::http(port, "POST", "/tokenize", tokenize_body);
        if (testing::http_status(r) == 200) ++tokenized;
      }
    });
  }
  const json heavy = {{"prompt", "In the beginning"}, {"max_tokens", 24}, {"stream", true},
                      {"guided_regex", "((.|\\n)*){100}"}};
  for (int i = 0; i < 4; ++i) {
    load.emplace_back([&] {
      while (!stop.load()) {
        const testing::RawSseStream s = testing::read_raw_sse(port, "/v1/completions", heavy.dump());
        if (s.status == 200) ++heavy_done;
      }
    });
  }
  // /health every 20 ms while the load runs, and another client's stream in the middle of it.
  std::vector<double> health_ms;
  std::atomic<bool> probing{true};
  std::thread prober([&] {
    while (probing.load()) {
      const Clock::time_point t = Clock::now();
      const int status = testing::http_status(testing::http(port, "GET", "/health"));
      health_ms.push_back(status == 200 ? ms_between(t, Clock::now()) : 1e9);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the load under way
  const StreamTiming loaded = timed_stream(port, kStreamTokens);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  probing.store(false);
  prober.join();
  stop.store(true);
  for (auto& t : load) t.join();

  const double p99 = percentile(health_ms, 0.99);
  const std::string metrics = testing::http_body(testing::http(port, "GET", "/metrics"));
  std::cout << "[ REPORT   ] /health p50 " << percentile(health_ms, 0.5) << " ms, p99 " << p99 << " ms, max "
            << percentile(health_ms, 1.0) << " ms over " << health_ms.size() << " probes; stream of "
            << kStreamTokens << " tokens: " << unloaded.total_ms << " ms unloaded, " << loaded.total_ms
            << " ms loaded (" << loaded.total_ms / unloaded.total_ms << "x; first bytes " << loaded.first_ms
            << " ms, longest gap " << loaded.longest_gap_ms << " ms); " << tokenized.load()
            << " 10 MB tokenizations, " << heavy_done.load() << " heavy-regex streams done" << std::endl;
  EXPECT_GE(health_ms.size(), 50u);
  // Measured alone: p99 about 10 ms (the REPORT line). The bound leaves room for a CI host
  // running another test's server beside this one and still fails what this guards against:
  // /health waiting seconds behind tokenizations on the I/O threads (17 s before).
  EXPECT_LT(p99, 250 * testing::kSlowdown) << "/health waited behind the load";
  EXPECT_TRUE(loaded.whole);
  // Its pace: alone on 2 cores this stream takes about 1.4x its unloaded time (the REPORT line;
  // docs/structured-output.md), 2.1x beside another test's server. The bound leaves room for
  // a busier host and still fails what this guards against: 4-7 s (30-50x), the stream's first
  // token waiting behind the grammars' walks, or 3-6 s before its first token when the
  // sequences waiting for those grammars' masks counted against the time-per-token budget
  // and held its admission back (the REPORT line's longest gap).
  EXPECT_LT(loaded.total_ms, 4 * unloaded.total_ms + 2000);
  EXPECT_NE(metrics.find("tessera:structured_mask_deferrals_total"), std::string::npos);
}

}  // namespace
}  // namespace tessera
