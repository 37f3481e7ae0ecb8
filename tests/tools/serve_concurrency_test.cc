// tessera-serve under concurrent load, the test process being the clients: hundreds of
// simultaneous streams, clients that hang up mid-stream, and a full request queue. A small
// fixture model (tiny-llama, token-id prompts) keeps it fast; every client has a timeout,
// so every test is bounded in time.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"
#include "tools/client/http_client.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Sum of every sample of `name` whose label set contains `label` (empty: all samples).
double metric(const std::string& text, const std::string& name, const std::string& label = "") {
  double sum = 0;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == std::string::npos || line.compare(0, end, name) != 0 || end != name.size()) continue;
    const size_t space = line.rfind(' ');
    const std::string labels = line.substr(end, space - end);
    if (!label.empty() && labels.find(label) == std::string::npos) continue;
    sum += std::stod(line.substr(space + 1));
  }
  return sum;
}

struct Metrics {
  std::string text;
  double get(const std::string& name, const std::string& label = "") const { return metric(text, name, label); }
};

Metrics scrape(const std::string& url) {
  auto client = HttpClient::create(url);
  EXPECT_TRUE(client.is_ok());
  auto r = client.value()->get("/metrics");
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return {};
  EXPECT_EQ(r->status, 200);
  return Metrics{r->body};
}

// All KV blocks free and nothing running or waiting.
bool idle(const Metrics& m) {
  return m.get("tessera:kv_cache_blocks_total") > 0 &&
         m.get("tessera:kv_cache_blocks_free") == m.get("tessera:kv_cache_blocks_total") &&
         m.get("tessera:num_requests_running") == 0 && m.get("tessera:num_requests_waiting") == 0;
}

// A distinct token-id prompt per client (tiny-llama has 512 ids and no tokenizer).
json prompt_ids(int i) {
  json ids = json::array();
  for (int k = 0; k < 4 + i % 13; ++k) ids.push_back(3 + (i * 7 + k * 31) % 500);
  return ids;
}

json stream_body(int i, int max_tokens) {
  return {{"prompt", prompt_ids(i)},   {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true},        {"stream", true},           {"stream_options", {{"include_usage", true}}},
          {"logprobs", 0}};
}

// Releases every waiting thread at once, so the requests arrive as one burst.
class StartGate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct StreamOutcome {
  std::string error;  // transport error, if any
  int status = 0;
  bool done = false;
  int tokens = 0;     // tokens seen in the stream (chunk logprobs)
  int usage_completion = -1, usage_prompt = -1;
  std::string finish_reason;
  int chunks = 0;
};

StreamOutcome run_stream(const std::string& url, const json& body, int stop_after_chunks = -1) {
  StreamOutcome out;
  HttpClientOptions co;
  co.timeout = std::chrono::seconds(120);
  auto client = HttpClient::create(url, co);
  if (!client.is_ok()) {
    out.error = client.status().to_string();
    return out;
  }
  auto on_event = [&](std::string_view payload) {
    const json j = json::parse(payload, nullptr, false);
    if (!j.is_object()) {
      out.error = "not JSON: " + std::string(payload);
      return false;
    }
    if (j.contains("error")) {
      out.error = j["error"].dump();
      return false;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      out.usage_completion = j["usage"]["completion_tokens"];
      out.usage_prompt = j["usage"]["prompt_tokens"];
    }
    for (const json& c : j["choices"]) {
      ++out.chunks;
      if (c["logprobs"].is_object()) out.tokens += static_cast<int>(c["logprobs"]["tokens"].size());
      if (c["finish_reason"].is_string()) out.finish_reason = c["finish_reason"];
    }
    return stop_after_chunks < 0 || out.chunks < stop_after_chunks;
  };
  auto r = client.value()->post_stream("/v1/completions", body.dump(), on_event);
  if (!r.is_ok()) {
    out.error = r.status().to_string();
    return out;
  }
  out.status = r->response.status;
  out.done = r->done;
  if (out.status != 200) out.error = r->response.body;
  return out;
}

std::string tiny() { return testing::fixtures_dir() + "/tiny-llama"; }

TEST(ServeConcurrency, TwoHundredConcurrentStreamsCompleteAndMetricsAgree) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", tiny(), "--set", "cache.num_blocks=2048"})) << server.log();
  const Metrics before = scrape(server.url());
  ASSERT_TRUE(idle(before)) << before.text;

  constexpr int kClients = 200, kMaxTokens = 16;
  std::vector<StreamOutcome> outcomes(kClients);
  StartGate gate;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      gate.wait();
      outcomes[i] = run_stream(server.url(), stream_body(i, kMaxTokens));
    });
  }
  const Clock::time_point start = Clock::now();
  gate.open();
  for (auto& t : threads) t.join();
  const double wall = seconds_since(start);
  std::cout << "[timing] " << kClients << " concurrent streams of " << kMaxTokens << " tokens: " << wall << " s\n";

  int64_t prompt_tokens = 0;
  for (int i = 0; i < kClients; ++i) {
    const StreamOutcome& o = outcomes[i];
    ASSERT_EQ(o.error, "") << "client " << i;
    EXPECT_EQ(o.status, 200) << "client " << i;
    EXPECT_TRUE(o.done) << "client " << i << ": no [DONE]";
    EXPECT_EQ(o.tokens, kMaxTokens) << "client " << i;
    EXPECT_EQ(o.usage_completion, kMaxTokens) << "client " << i;
    EXPECT_EQ(o.usage_prompt, static_cast<int>(prompt_ids(i).size())) << "client " << i;
    EXPECT_EQ(o.finish_reason, "length") << "client " << i;
    prompt_tokens += o.usage_prompt;
  }

  // The counters agree exactly with what the clients saw, and every KV block is free again.
  Metrics after;
  const Clock::time_point poll = Clock::now();
  do {
    after = scrape(server.url());
  } while (!(idle(after) && after.get("tessera:request_success_total") - before.get("tessera:request_success_total") >=
                                kClients) &&
           seconds_since(poll) < 5);
  auto delta = [&](const std::string& name, const std::string& label = "") {
    return after.get(name, label) - before.get(name, label);
  };
  EXPECT_EQ(delta("tessera:request_success_total", "finished_reason=\"length\""), kClients) << after.text;
  EXPECT_EQ(delta("tessera:request_success_total"), kClients);
  EXPECT_EQ(delta("tessera:request_failure_total"), 0);
  EXPECT_EQ(delta("tessera:generation_tokens_total"), kClients * kMaxTokens);
  EXPECT_EQ(delta("tessera:prompt_tokens_total"), static_cast<double>(prompt_tokens));
  EXPECT_EQ(delta("tessera:e2e_request_latency_seconds_count"), kClients);
  EXPECT_TRUE(idle(after)) << after.text;
}

TEST(ServeConcurrency, ClientsHangingUpMidStreamFreeTheirKvBlocksWithinASecond) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", tiny(), "--set", "cache.num_blocks=2048"})) << server.log();
  const Metrics before = scrape(server.url());
  ASSERT_TRUE(idle(before)) << before.text;

  // Long generations (1500 tokens each) that every client leaves after 3 chunks.
  constexpr int kClients = 50;
  std::vector<StreamOutcome> outcomes(kClients);
  std::vector<Clock::time_point> hung_up(kClients);
  StartGate gate;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      gate.wait();
      outcomes[i] = run_stream(server.url(), stream_body(i, 1500), /*stop_after_chunks=*/3);
      hung_up[i] = Clock::now();  // the client has closed its connection
    });
  }
  const Clock::time_point start = Clock::now();
  gate.open();
  for (auto& t : threads) t.join();
  const Clock::time_point last = *std::max_element(hung_up.begin(), hung_up.end());
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(outcomes[i].error, "") << "client " << i;
    EXPECT_EQ(outcomes[i].status, 200);
    EXPECT_EQ(outcomes[i].chunks, 3);
    EXPECT_FALSE(outcomes[i].done);
  }

  Metrics m;
  do {
    m = scrape(server.url());
  } while (!idle(m) && seconds_since(last) < 5);
  const double freed_after = seconds_since(last);
  std::cout << "[timing] " << kClients << " streams opened and left: " << std::chrono::duration<double>(last - start).count()
            << " s; all KV blocks free " << freed_after << " s after the last hang-up\n";
  ASSERT_TRUE(idle(m)) << m.text;
  EXPECT_LE(freed_after, 1.0);
  EXPECT_EQ(m.get("tessera:request_success_total", "finished_reason=\"abort\"") -
                before.get("tessera:request_success_total", "finished_reason=\"abort\""),
            kClients);

  // The server still serves.
  const StreamOutcome next = run_stream(server.url(), stream_body(7, 8));
  EXPECT_EQ(next.error, "");
  EXPECT_EQ(next.status, 200);
  EXPECT_TRUE(next.done);
  EXPECT_EQ(next.tokens, 8);
}

TEST(ServeConcurrency, AFullQueueAnswers429WithRetryAfterAndTheRestComplete) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  // Two running and two waiting at most: a burst of 24 cannot all be admitted.
  ASSERT_TRUE(server.start({"--model", tiny(), "--set", "cache.num_blocks=512", "--set", "server.max_queued_requests=2",
                            "--set", "scheduler.max_num_seqs=2"}))
      << server.log();
  const Metrics before = scrape(server.url());

  constexpr int kClients = 24, kMaxTokens = 200;
  struct Result {
    std::string error;
    int status = 0;
    std::string retry_after, error_type, error_code;
    int completion_tokens = -1;
  };
  std::vector<Result> results(kClients);
  StartGate gate;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Result& r = results[i];
      HttpClientOptions co;
      co.timeout = std::chrono::seconds(120);
      auto client = HttpClient::create(server.url(), co);
      if (!client.is_ok()) {
        r.error = client.status().to_string();
        return;
      }
      json body = stream_body(i, kMaxTokens);
      HttpResponse resp;
      gate.wait();
      if (i % 2 == 0) {  // half of them streaming: a refusal comes before any event
        StreamOutcome s;
        auto sr = client.value()->post_stream("/v1/completions", body.dump(), [&](std::string_view payload) {
          const json j = json::parse(payload, nullptr, false);
          if (j.contains("usage") && j["usage"].is_object()) s.usage_completion = j["usage"]["completion_tokens"];
          return true;
        });
        if (!sr.is_ok()) {
          r.error = sr.status().to_string();
          return;
        }
        resp = sr->response;
        r.completion_tokens = s.usage_completion;
        if (resp.status == 200 && !sr->done) r.error = "no [DONE]";
      } else {
        body["stream"] = false;
        body.erase("stream_options");
        auto pr = client.value()->post_json("/v1/completions", body.dump());
        if (!pr.is_ok()) {
          r.error = pr.status().to_string();
          return;
        }
        resp = pr.value();
        if (resp.status == 200) r.completion_tokens = json::parse(resp.body)["usage"]["completion_tokens"];
      }
      r.status = resp.status;
      r.retry_after = resp.header("Retry-After");
      if (resp.status != 200) {
        const json j = json::parse(resp.body, nullptr, false);
        if (j.is_object() && j.contains("error")) {
          r.error_type = j["error"].value("type", "");
          r.error_code = j["error"].value("code", "");
        }
      }
    });
  }
  const Clock::time_point start = Clock::now();
  gate.open();
  for (auto& t : threads) t.join();
  const double wall = seconds_since(start);

  int ok = 0, refused = 0;
  for (int i = 0; i < kClients; ++i) {
    const Result& r = results[i];
    ASSERT_EQ(r.error, "") << "client " << i;
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(r.completion_tokens, kMaxTokens) << "client " << i;
    } else {
      ++refused;
      EXPECT_EQ(r.status, 429) << "client " << i;
      EXPECT_EQ(r.retry_after, "1") << "client " << i;
      EXPECT_EQ(r.error_type, "rate_limit_error") << "client " << i;
      EXPECT_EQ(r.error_code, "queue_full") << "client " << i;
    }
  }
  std::cout << "[timing] burst of " << kClients << " with 2 running + 2 queued: " << ok << " completed, " << refused
            << " refused (429) in " << wall << " s\n";
  EXPECT_GE(ok, 2);
  EXPECT_GE(refused, 1);
  const Metrics after = scrape(server.url());
  EXPECT_EQ(after.get("tessera:http_responses_total", "code=\"429\"") -
                before.get("tessera:http_responses_total", "code=\"429\""),
            refused);
}

}  // namespace
}  // namespace tessera
