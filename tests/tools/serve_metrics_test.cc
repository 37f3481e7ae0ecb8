// /metrics of a real tessera-serve child, read by a Prometheus text-format parser
// (tests/prometheus_text.h): the series vLLM exports exist under their vLLM names with the
// right TYPE lines, and after a scripted mix of requests (n = 1, a repeated prompt, n = 4, a
// client that hangs up mid-stream, and an n = 2 request that a small KV pool forces to
// preempt one choice) every counter moved by exactly what the requests' own responses say,
// counted per request as vLLM counts them. tiny-llama (token-id prompts) keeps it fast.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/prometheus_text.h"
#include "tests/test_support.h"
#include "tests/tools/serve_process.h"
#include "tools/client/http_client.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::PromLabels;
using testing::PromPage;

const PromLabels kModel = {{"model_name", "tiny-llama"}};

PromLabels with_model(PromLabels extra) {
  extra.insert(kModel.begin(), kModel.end());
  return extra;
}

PromPage scrape(HttpClient& client) {
  auto r = client.get("/metrics");
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return {};
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->header("Content-Type").find("text/plain; version=0.0.4"), std::string::npos);
  auto page = testing::parse_prometheus_text(r->body);
  EXPECT_TRUE(page.is_ok()) << page.status().to_string() << "\n" << r->body;
  return page.is_ok() ? std::move(page).value() : PromPage{};
}

// A scrape once the gauges show nothing running, waiting or holding KV blocks. Counters are
// final when a response is sent; the gauges follow at the engine loop's next publish, which
// a quick scrape on a loaded machine can overtake.
PromPage scrape_idle(HttpClient& client) {
  PromPage page;
  for (int i = 0; i < 200; ++i) {
    page = scrape(client);
    if (page.value("vllm:num_requests_running", kModel) == 0 && page.value("vllm:num_requests_waiting", kModel) == 0 &&
        page.value("vllm:kv_cache_usage_perc", kModel) == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return page;
}

// Token ids 3.. (tiny-llama has 512 ids and no tokenizer), starting at `first`.
json ids(int first, int count) {
  json a = json::array();
  for (int k = 0; k < count; ++k) a.push_back(first + k * 7 % 400);
  return a;
}

struct Expected {
  double prompt = 0, generation = 0, itl = 0;
  double stop = 0, length = 0;
  int requests = 0;  // completed (stop or length)
};

// A non-streaming completion; adds what its response reports to `e`.
json complete(HttpClient& client, const json& body, Expected& e) {
  auto r = client.post_json("/v1/completions", body.dump());
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return {};
  EXPECT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  e.prompt += j["usage"]["prompt_tokens"].get<double>();
  e.generation += j["usage"]["completion_tokens"].get<double>();
  bool any_length = false;
  for (const json& c : j["choices"]) {
    const std::string reason = c["finish_reason"];
    any_length |= reason == "length";
    // Every choice's tokens after its first have an inter-token latency.
    e.itl += static_cast<double>(c["logprobs"]["tokens"].size()) - 1;
  }
  (any_length ? e.length : e.stop) += 1;
  ++e.requests;
  return j;
}

TEST(PrometheusText, ParsesWhatScrapersAcceptAndRefusesTheRest) {
  const std::string good =
      "# HELP a_total A counter.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\n\"} 3\n"
      "# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.7\nh_count 2\n";
  auto page = testing::parse_prometheus_text(good);
  ASSERT_TRUE(page.is_ok()) << page.status().to_string();
  EXPECT_EQ(page->value("a_total", {{"x", "1"}}), 3);
  EXPECT_EQ(page->count("a_total", {{"y", "q\"\n"}}), 1);
  EXPECT_EQ(page->type("h"), "histogram");
  for (const char* bad : {"x 1\n",                                              // no TYPE line
                          "# TYPE x gauge\nx{a=\"1} 2\n",                        // unterminated label
                          "# TYPE x gauge\nx 1e\n",                              // bad value
                          "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
                          "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n",
                          "# TYPE x gauge\nx 1"}) {                              // no final newline
    EXPECT_FALSE(testing::parse_prometheus_text(bad).is_ok()) << bad;
  }
}

TEST(ServeMetrics, VllmSeriesCountPerRequestThroughAScriptedMix) {
  TESSERA_REQUIRE_FIXTURES();
  // 10 blocks of 16 tokens: each request below fits alone, but the n = 2 one's two choices
  // (6 blocks each at the end) do not fit together, so one is preempted, exactly once.
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--set", "model.dtype=float32",
                            "--set", "worker.backend=cpu", "--set", "worker.threads=1", "--set",
                            "cache.num_blocks=10", "--set", "cache.block_size=16"}))
      << server.log();
  auto made = HttpClient::create(server.url());
  ASSERT_TRUE(made.is_ok());
  HttpClient& client = *made.value();

  const PromPage before = scrape(client);
  // Every vLLM series exists, with vLLM's type and the model_name label.
  const std::vector<std::pair<std::string, std::string>> kSeries = {
      {"vllm:num_requests_running", "gauge"},        {"vllm:num_requests_waiting", "gauge"},
      {"vllm:kv_cache_usage_perc", "gauge"},         {"vllm:prompt_tokens_total", "counter"},
      {"vllm:generation_tokens_total", "counter"},   {"vllm:request_success_total", "counter"},
      {"vllm:num_preemptions_total", "counter"},     {"vllm:prefix_cache_queries_total", "counter"},
      {"vllm:prefix_cache_hits_total", "counter"},   {"vllm:time_to_first_token_seconds", "histogram"},
      {"vllm:inter_token_latency_seconds", "histogram"}, {"vllm:e2e_request_latency_seconds", "histogram"},
      {"vllm:request_queue_time_seconds", "histogram"},  {"vllm:request_prefill_time_seconds", "histogram"},
      {"vllm:request_decode_time_seconds", "histogram"}};
  for (const auto& [name, type] : kSeries) {
    EXPECT_EQ(before.type(name), type) << name;
    const std::string sample = type == "histogram" ? name + "_count" : name;
    EXPECT_GE(before.count(sample, kModel), 1) << sample;
  }
  for (const char* reason : {"stop", "length", "abort"})
    EXPECT_EQ(before.count("vllm:request_success_total", with_model({{"finished_reason", reason}})), 1) << reason;
  // Bucket bounds are short decimals, as Prometheus' own clients print them.
  EXPECT_EQ(before.count("vllm:time_to_first_token_seconds_bucket", with_model({{"le", "0.005"}})), 1);
  EXPECT_EQ(before.count("vllm:e2e_request_latency_seconds_bucket", with_model({{"le", "1.0"}})), 1);

  auto delta = [&](const PromPage& now, const PromPage& then, const std::string& name, PromLabels labels = {}) {
    labels.insert(kModel.begin(), kModel.end());
    return now.value(name, labels) - then.value(name, labels);
  };

  // Phase 1: n = 1, the same prompt again (its first full block comes from the prefix
  // cache), and n = 4 (counted as one request with its prompt once).
  Expected e;
  const json first = {{"prompt", ids(3, 20)}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true},
                      {"logprobs", 0}};
  complete(client, first, e);
  complete(client, first, e);
  complete(client,
           {{"prompt", ids(100, 10)}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 5}, {"n", 4},
            {"ignore_eos", true}, {"logprobs", 0}},
           e);
  const PromPage p1 = scrape_idle(client);
  EXPECT_EQ(delta(p1, before, "vllm:prompt_tokens_total"), 20 + 20 + 10);
  EXPECT_EQ(delta(p1, before, "vllm:prompt_tokens_total"), e.prompt);
  EXPECT_EQ(delta(p1, before, "vllm:generation_tokens_total"), 8 + 8 + 4 * 8);
  EXPECT_EQ(delta(p1, before, "vllm:generation_tokens_total"), e.generation);
  EXPECT_EQ(delta(p1, before, "vllm:request_success_total", {{"finished_reason", "length"}}), 3);
  EXPECT_EQ(delta(p1, before, "vllm:request_success_total", {{"finished_reason", "stop"}}), 0);
  EXPECT_EQ(delta(p1, before, "vllm:request_success_total", {{"finished_reason", "abort"}}), 0);
  for (const char* h : {"vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                        "vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
                        "vllm:request_decode_time_seconds_count"}) {
    EXPECT_EQ(delta(p1, before, h), 3) << h;
  }
  EXPECT_EQ(delta(p1, before, "vllm:inter_token_latency_seconds_count"), 7 + 7 + 4 * 7);
  EXPECT_EQ(delta(p1, before, "vllm:inter_token_latency_seconds_count"), e.itl);
  // Each request's prompt was looked up once (the n = 4 one's choices fork from its prompt);
  // the repeat found the first 16-token block cached.
  EXPECT_EQ(delta(p1, before, "vllm:prefix_cache_queries_total"), 20 + 20 + 10);
  EXPECT_EQ(delta(p1, before, "vllm:prefix_cache_hits_total"), 16);
  EXPECT_EQ(delta(p1, before, "vllm:num_preemptions_total"), 0);
  EXPECT_EQ(p1.value("vllm:num_requests_running", kModel), 0);
  EXPECT_EQ(p1.value("vllm:num_requests_waiting", kModel), 0);
  EXPECT_EQ(p1.value("vllm:kv_cache_usage_perc", kModel), 0);
  // The tessera: series count requests the same way.
  EXPECT_EQ(delta(p1, before, "tessera:prompt_tokens_total"), 50);
  EXPECT_EQ(delta(p1, before, "tessera:request_success_total", {{"finished_reason", "length"}}), 3);

  // Phase 2: a stream whose client hangs up after its first tokens: one aborted request,
  // running while it streamed.
  PromPage during;
  int streamed = 0;
  {
    auto sc = HttpClient::create(server.url());
    ASSERT_TRUE(sc.is_ok());
    // logprobs: a model without a tokenizer streams a chunk per token only with them.
    const json body = {{"prompt", ids(200, 12)}, {"max_tokens", 140}, {"temperature", 0}, {"ignore_eos", true},
                       {"stream", true},         {"logprobs", 0}};
    auto r = sc.value()->post_stream("/v1/completions", body.dump(), [&](std::string_view) {
      if (++streamed == 1) {
        // The engine loop publishes its gauges right after the step that sent this token; on
        // a loaded machine the scrape can still overtake it, so look again for a moment.
        for (int i = 0; i < 50; ++i) {
          during = scrape(client);
          if (during.value("vllm:num_requests_running", kModel) == 1) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      return streamed < 2;
    });
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(r->stopped);
  }
  EXPECT_EQ(during.value("vllm:num_requests_running", kModel), 1);
  EXPECT_EQ(during.value("vllm:num_requests_waiting", kModel), 0);
  EXPECT_GT(during.value("vllm:kv_cache_usage_perc", kModel), 0);
  PromPage p2;
  for (int i = 0; i < 200; ++i) {  // the abort lands on the engine loop shortly after the hang-up
    p2 = scrape_idle(client);
    if (delta(p2, p1, "vllm:request_success_total", {{"finished_reason", "abort"}}) > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(delta(p2, p1, "vllm:request_success_total", {{"finished_reason", "abort"}}), 1);
  EXPECT_EQ(delta(p2, p1, "vllm:request_success_total", {{"finished_reason", "length"}}), 0);
  EXPECT_EQ(delta(p2, p1, "vllm:prompt_tokens_total"), 12);  // its prompt was prefilled
  EXPECT_EQ(delta(p2, p1, "vllm:time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(delta(p2, p1, "vllm:e2e_request_latency_seconds_count"), 0) << "only completed requests";
  const double gen2 = delta(p2, p1, "vllm:generation_tokens_total");
  EXPECT_GE(gen2, 2);
  EXPECT_LT(gen2, 140) << "the abort should have cut the stream";
  EXPECT_EQ(delta(p2, p1, "vllm:prefix_cache_queries_total"), 12);
  EXPECT_EQ(p2.value("vllm:num_requests_running", kModel), 0);

  // Phase 3: n = 2 whose choices outgrow the pool together: one preemption, one request.
  Expected e3;
  complete(client,
           {{"prompt", ids(300, 8)}, {"max_tokens", 80}, {"temperature", 1.0}, {"seed", 9}, {"n", 2},
            {"ignore_eos", true}, {"logprobs", 0}},
           e3);
  const PromPage p3 = scrape_idle(client);
  EXPECT_EQ(delta(p3, p2, "vllm:num_preemptions_total"), 1);
  EXPECT_EQ(delta(p3, p2, "tessera:num_preemptions_total"), 1);
  EXPECT_EQ(delta(p3, p2, "vllm:prompt_tokens_total"), 8) << "a recomputed prompt is not counted again";
  EXPECT_EQ(delta(p3, p2, "vllm:generation_tokens_total"), 2 * 80);
  EXPECT_EQ(delta(p3, p2, "vllm:request_success_total", {{"finished_reason", "length"}}), 1);
  EXPECT_EQ(delta(p3, p2, "vllm:e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(delta(p3, p2, "vllm:request_decode_time_seconds_count"), 1);
  EXPECT_EQ(delta(p3, p2, "vllm:inter_token_latency_seconds_count"), e3.itl);
  // The prompt's lookup, then the preempted choice's own (prompt + its output so far).
  EXPECT_GT(delta(p3, p2, "vllm:prefix_cache_queries_total"), 8 + 1);
  EXPECT_LE(delta(p3, p2, "vllm:prefix_cache_hits_total"), delta(p3, p2, "vllm:prefix_cache_queries_total"));
  EXPECT_EQ(p3.value("vllm:num_requests_running", kModel), 0);
  EXPECT_EQ(p3.value("vllm:kv_cache_usage_perc", kModel), 0);
}

}  // namespace
}  // namespace tessera
