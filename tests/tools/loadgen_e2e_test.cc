// tessera-loadgen as a real process against a real tessera-serve (kjv-llama, which has a
// tokenizer, so every token is streamed as its own event): a 3-rate sweep over HTTP and a
// run over the ZeroMQ client API complete, write the contract JSON and the plots, and their
// request and token counts equal the server's /metrics deltas exactly; a remote target is
// refused without --allow-remote; a server with a tiny queue driven above capacity answers
// 429s, which the load generator reports, and the run still ends in bounded time.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <memory>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"
#include "tools/client/http_client.h"
#include "tools/loadgen/server_metrics.h"

namespace tessera::loadgen {
namespace {

using nlohmann::json;
using testing::shell_quote;

std::string kjv() { return testing::fixtures_dir() + "/kjv-llama"; }

testing::CommandResult loadgen(const std::string& args) {
  return testing::run_command(testing::bin_dir() + "/tessera-loadgen --no-progress " + args);
}

ServerCounters counters(const std::string& url) {
  auto c = scrape_server_counters(url);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.is_ok() ? c.value() : ServerCounters{};
}

double http_count(const ServerCounters& c, const std::string& code) {
  const auto it = c.http_responses.find(code);
  return it == c.http_responses.end() ? 0 : it->second;
}

void expect_contract_keys(const json& run) {
  for (const char* key : {"rate", "completed", "failed", "errors", "requests_per_s", "output_tokens_per_s",
                          "goodput_requests_per_s", "ttft_s", "tpot_s", "itl_s", "e2e_s"}) {
    EXPECT_TRUE(run.contains(key)) << key << " in " << run.dump();
  }
  EXPECT_TRUE(run["errors"].is_object());
  for (const char* key : {"ttft_s", "tpot_s", "itl_s", "e2e_s"}) {
    for (const char* p : {"p50", "p90", "p99", "max"}) EXPECT_TRUE(run[key].contains(p)) << key << "." << p;
  }
}

struct Totals {
  long long completed = 0, failed = 0, output_tokens = 0, input_tokens = 0;
};
Totals totals_of(const json& result) {
  Totals t;
  for (const json& run : result["runs"]) {
    t.completed += run["completed"].get<long long>();
    t.failed += run["failed"].get<long long>();
    t.output_tokens += run["output_tokens"].get<long long>();
    t.input_tokens += run["input_tokens"].get<long long>();
  }
  return t;
}

class Loadgen : public testing::KjvServeSuite {
 protected:
  void SetUp() override {
    KjvServeSuite::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    dir_ = testing::make_temp_dir("loadgen-e2e");
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(Loadgen, HttpSweepMatchesServerMetricsExactly) {
  const ServerCounters before = counters(server_->url());
  const std::string out = dir_ + "/out.json", plots = dir_ + "/plots";
  auto r = loadgen("--url " + server_->url() + " --sweep 5,10,20 --requests 12 --input-len uniform:8:48 " +
                   "--output-len uniform:4:24 --seed 3 --slo ttft=2s,tpot=500ms --json " + out + " --plots " + plots);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const ServerCounters after = counters(server_->url());
  const json result = json::parse(testing::read_file(out));
  ASSERT_EQ(result["runs"].size(), 3u);
  const std::vector<double> rates = {5, 10, 20};
  for (size_t i = 0; i < 3; ++i) {
    const json& run = result["runs"][i];
    expect_contract_keys(run);
    EXPECT_EQ(run["rate"], rates[i]);
    EXPECT_EQ(run["completed"], 12) << run.dump();
    EXPECT_EQ(run["failed"], 0);
    EXPECT_TRUE(run["errors"].empty());
    EXPECT_GT(run["requests_per_s"].get<double>(), 0);
    EXPECT_GT(run["output_tokens_per_s"].get<double>(), 0);
    EXPECT_LE(run["goodput_requests_per_s"].get<double>(), run["requests_per_s"].get<double>() + 1e-9);
    EXPECT_TRUE(run["ttft_s"]["p99"].is_number());
    EXPECT_GT(run["itl_s"]["count"].get<int>(), 0);
    EXPECT_LE(run["ttft_s"]["p50"].get<double>(), run["ttft_s"]["p99"].get<double>());
    EXPECT_LE(run["ttft_s"]["p99"].get<double>(), run["ttft_s"]["max"].get<double>());
    EXPECT_LE(run["ttft_s"]["max"].get<double>(), run["e2e_s"]["max"].get<double>());
  }
  // Exactly what the server counted.
  const Totals t = totals_of(result);
  EXPECT_EQ(t.completed, 36);
  EXPECT_EQ(t.completed, static_cast<long long>(after.request_success - before.request_success));
  EXPECT_EQ(t.output_tokens, static_cast<long long>(after.generation_tokens - before.generation_tokens));
  EXPECT_EQ(t.input_tokens, static_cast<long long>(after.prompt_tokens - before.prompt_tokens));
  EXPECT_EQ(after.request_failure, before.request_failure);
  // The same seed: every run's requests are the same, so the token totals are too.
  EXPECT_EQ(result["runs"][0]["output_tokens"], result["runs"][2]["output_tokens"]);
  // The table, and the plots when gnuplot is here.
  EXPECT_NE(r.out.find("TTFT p99"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(plots + "/plots.gp"));
  if (testing::run_command("gnuplot --version").exit_code == 0) {
    EXPECT_GT(std::filesystem::file_size(plots + "/latency_cdf.svg"), 1000u);
    EXPECT_GT(std::filesystem::file_size(plots + "/sweep.svg"), 1000u);
  } else {
    EXPECT_NE(r.err.find("gnuplot not found"), std::string::npos) << r.err;
  }
}

TEST_F(Loadgen, ZmqRunMatchesServerMetricsExactly) {
  const ServerCounters before = counters(server_->url());
  const std::string out = dir_ + "/zmq.json";
  auto r = loadgen("--zmq " + shell_quote(server_->zmq_endpoint()) + " --rate 20 --requests 15 --output-len 16 " +
                   "--json " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  // Closed loop over HTTP with its JSON's achieved rate and concurrency.
  const std::string closed = dir_ + "/closed.json";
  auto c = loadgen("--url " + server_->url() + " --concurrency 3 --requests 9 --output-len 8 --json " + closed);
  ASSERT_EQ(c.exit_code, 0) << c.err << c.out;
  const ServerCounters after = counters(server_->url());

  const json zr = json::parse(testing::read_file(out));
  ASSERT_EQ(zr["runs"].size(), 1u);
  expect_contract_keys(zr["runs"][0]);
  EXPECT_EQ(zr["runs"][0]["completed"], 15);
  EXPECT_EQ(zr["runs"][0]["output_tokens"], 15 * 16);
  EXPECT_GT(zr["runs"][0]["itl_s"]["count"].get<int>(), 0);
  const json cr = json::parse(testing::read_file(closed));
  EXPECT_EQ(cr["runs"][0]["concurrency"], 3);
  EXPECT_EQ(cr["runs"][0]["completed"], 9);
  EXPECT_GT(cr["runs"][0]["rate"].get<double>(), 0);

  const Totals z = totals_of(zr), h = totals_of(cr);
  EXPECT_EQ(z.completed + h.completed, static_cast<long long>(after.request_success - before.request_success));
  EXPECT_EQ(z.output_tokens + h.output_tokens,
            static_cast<long long>(after.generation_tokens - before.generation_tokens));
  EXPECT_EQ(z.input_tokens + h.input_tokens, static_cast<long long>(after.prompt_tokens - before.prompt_tokens));
}

// --endpoint embeddings (HTTP and ZeroMQ) and responses: every request completes, the input
// tokens are the server's prompt tokens, embeddings generate none and responses stream some.
TEST_F(Loadgen, EmbeddingsAndResponsesEndpoints) {
  const ServerCounters before = counters(server_->url());
  const std::string http = dir_ + "/embeddings_http.json", zmq = dir_ + "/embeddings_zmq.json";
  auto e = loadgen("--url " + server_->url() + " --endpoint embeddings --concurrency 2 --requests 6 --input-len 24 --json " + http);
  ASSERT_EQ(e.exit_code, 0) << e.err << e.out;
  auto z = loadgen("--zmq " + shell_quote(server_->zmq_endpoint()) +
                   " --endpoint embeddings --concurrency 2 --requests 4 --input-len 24 --json " + zmq);
  ASSERT_EQ(z.exit_code, 0) << z.err << z.out;
  const ServerCounters mid = counters(server_->url());
  for (const auto& [file, n] : {std::pair<std::string, int>{http, 6}, {zmq, 4}}) {
    const json run = json::parse(testing::read_file(file))["runs"][0];
    EXPECT_EQ(run["completed"], n) << run.dump();
    EXPECT_EQ(run["failed"], 0) << run.dump();
    EXPECT_EQ(run["output_tokens"], 0) << run.dump();
    EXPECT_EQ(json::parse(testing::read_file(file))["config"]["endpoint"], "embeddings");
  }
  const long long embedded = totals_of(json::parse(testing::read_file(http))).input_tokens +
                             totals_of(json::parse(testing::read_file(zmq))).input_tokens;
  EXPECT_EQ(embedded, static_cast<long long>(mid.prompt_tokens - before.prompt_tokens));

  const std::string responses = dir_ + "/responses.json";
  auto r = loadgen("--url " + server_->url() + " --endpoint responses --concurrency 2 --requests 4 --output-len 8 --json " +
                   responses);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json run = json::parse(testing::read_file(responses))["runs"][0];
  EXPECT_EQ(run["completed"], 4) << run.dump();
  EXPECT_GT(run["output_tokens"].get<int>(), 0) << run.dump();
  EXPECT_GT(run["ttft_s"]["count"].get<int>(), 0) << run.dump();
  EXPECT_EQ(loadgen("--zmq " + shell_quote(server_->zmq_endpoint()) + " --endpoint responses --requests 1 --rate 1 --json " +
                    dir_ + "/x.json").exit_code, 2);
}

// server.curve.client_api: with the server's public key the run completes; without it the
// handshake fails, and the run ends at once with that error (no JSON) instead of timing out
// request by request; the key file without --zmq is a usage error.
TEST(LoadgenCurve, ZmqClientApiWithCurve) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("loadgen-curve");
  std::vector<std::string> args = testing::curve_client_api_args(dir);
  ASSERT_FALSE(args.empty()) << "tessera-curve-keygen failed";
  args.insert(args.end(), {"--model", kjv(), "--set", "cache.num_blocks=64"});
  testing::ServeProcess server;
  ASSERT_TRUE(server.start(args)) << server.log();
  const std::string zmq = "--zmq " + shell_quote(server.zmq_endpoint()) + " --rate 20 --requests 4 --output-len 4 ";
  auto r = loadgen(zmq + "--curve-server-key-file " + dir + "/server.pub --json " + dir + "/ok.json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json ok = json::parse(testing::read_file(dir + "/ok.json"));
  EXPECT_EQ(ok["runs"][0]["completed"], 4) << ok.dump();
  EXPECT_EQ(ok["runs"][0]["failed"], 0) << ok.dump();

  r = loadgen(zmq + "--request-timeout 120 --json " + dir + "/no.json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("handshake"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--curve-server-key-file"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/no.json"));

  r = loadgen("--url " + server.url() + " --curve-server-key-file " + dir + "/server.pub --rate 1 --requests 1 --json " +
              dir + "/x.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--zmq"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(LoadgenCli, RefusesRemoteTargetsAndBadUsage) {
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = testing::make_temp_dir("loadgen-cli");
  auto r = loadgen("--url http://192.0.2.1:8000 --rate 1 --requests 1 --json " + dir + "/x.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--allow-remote"), std::string::npos) << r.err;
  r = loadgen("--zmq tcp://192.0.2.1:5555 --rate 1 --requests 1 --json " + dir + "/x.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--allow-remote"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.json"));
  // Nothing was sent: refused at once.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // Unbounded or incomplete command lines are usage errors.
  EXPECT_EQ(loadgen("--url http://127.0.0.1:1 --rate 1 --json " + dir + "/x.json").exit_code, 2);
  EXPECT_EQ(loadgen("--url http://127.0.0.1:1 --requests 3 --json " + dir + "/x.json").exit_code, 2);
  EXPECT_EQ(loadgen("--url http://127.0.0.1:1 --rate 1 --requests 3").exit_code, 2);
  EXPECT_EQ(loadgen("--rate 1 --concurrency 2 --requests 3 --json " + dir + "/x.json").exit_code, 2);
  std::filesystem::remove_all(dir);
}

TEST(LoadgenOverload, QueueFullAnswersAre429sAndTheRunEnds) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", kjv(), "--set", "scheduler.max_num_seqs=1", "--set",
                            "scheduler.max_num_batched_tokens=256", "--set", "server.max_queued_requests=1"}))
      << server.log();
  const std::string dir = testing::make_temp_dir("loadgen-429");
  const ServerCounters before = counters(server.url());
  const auto start = std::chrono::steady_clock::now();
  auto r = loadgen("--url " + server.url() + " --rate 100 --duration 2 --output-len 48 --json " + dir + "/o.json");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const ServerCounters after = counters(server.url());
  const json run = json::parse(testing::read_file(dir + "/o.json"))["runs"][0];
  expect_contract_keys(run);
  ASSERT_TRUE(run["errors"].contains("http_429")) << run.dump();
  const int n429 = run["errors"]["http_429"];
  EXPECT_GT(n429, 0);
  EXPECT_EQ(run["failed"], n429);  // nothing else went wrong
  EXPECT_GT(run["completed"].get<int>(), 0);
  EXPECT_EQ(n429, static_cast<int>(http_count(after, "429") - http_count(before, "429")));
  EXPECT_EQ(run["completed"].get<long long>(), static_cast<long long>(after.request_success - before.request_success));
  EXPECT_EQ(run["output_tokens"].get<long long>(),
            static_cast<long long>(after.generation_tokens - before.generation_tokens));
  EXPECT_NE(r.out.find("http_429"), std::string::npos) << r.out;  // in the table
  EXPECT_LT(took, 60) << "the run did not stop by its duration";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::loadgen
