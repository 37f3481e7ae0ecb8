// tessera-loadgen's statistics against values computed by hand on a small synthetic trace:
// percentiles (linear interpolation between closest ranks, numpy's default), TTFT / TPOT /
// every inter-token gap / end-to-end latency, rates, goodput under SLOs, errors by kind, and
// the throughput of a sweep at a p99-TTFT objective.
#include <gtest/gtest.h>

#include <cmath>

#include "tools/loadgen/report.h"
#include "tools/loadgen/server_metrics.h"
#include "tools/loadgen/stats.h"

namespace tessera::loadgen {
namespace {

constexpr double kEps = 1e-12;

RequestRecord done(int index, double sent, std::vector<double> tokens, int out_tokens) {
  RequestRecord r;
  r.index = index;
  r.scheduled_s = sent;
  r.sent_s = sent;
  r.token_times_s = std::move(tokens);
  r.end_s = r.token_times_s.empty() ? sent : r.token_times_s.back();
  r.input_tokens = 8;
  r.output_tokens = out_tokens;
  r.ok = true;
  return r;
}

// R0: TTFT 0.1, E2E 0.4, TPOT (0.4-0.1)/2 = 0.15, gaps 0.1, 0.2
// R1: TTFT 0.3, E2E 0.6, TPOT 0.3/3 = 0.1, gaps 0.1, 0.1, 0.1
// R2: one token: TTFT 0.2, E2E 0.2, no TPOT, no gap
// R3: HTTP 429
// R4: TTFT 0.5, E2E 1.0, TPOT 0.5, gap 0.5
std::vector<RequestRecord> trace() {
  std::vector<RequestRecord> t;
  t.push_back(done(0, 0.0, {0.1, 0.2, 0.4}, 3));
  t.push_back(done(1, 0.5, {0.8, 0.9, 1.0, 1.1}, 4));
  t.push_back(done(2, 1.0, {1.2}, 1));
  RequestRecord failed;
  failed.index = 3;
  failed.sent_s = 1.5;
  failed.end_s = 1.51;
  failed.error_kind = "http_429";
  t.push_back(failed);
  t.push_back(done(4, 2.0, {2.5, 3.0}, 2));
  return t;
}

TEST(LoadgenStats, PercentileIsLinearBetweenClosestRanks) {
  const std::vector<double> x = {1, 2, 3, 4};
  EXPECT_NEAR(percentile(x, 0), 1, kEps);
  EXPECT_NEAR(percentile(x, 50), 2.5, kEps);   // h = 1.5
  EXPECT_NEAR(percentile(x, 90), 3.7, kEps);   // h = 2.7
  EXPECT_NEAR(percentile(x, 99), 3.97, kEps);  // h = 2.97
  EXPECT_NEAR(percentile(x, 100), 4, kEps);
  EXPECT_NEAR(percentile({7}, 99), 7, kEps);
  // numpy.percentile([1, 2, 3, 4, 5], 40) == 2.6 (h = 1.6); [10, ..., 100, 1000] at 95: h = 9.5
  EXPECT_NEAR(percentile({1, 2, 3, 4, 5}, 40), 2.6, kEps);
  EXPECT_NEAR(percentile({10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 1000}, 95), 550, 1e-9);
  const Summary s = summarize({3, 1, 2, 4});
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.p50, 2.5, kEps);
  EXPECT_NEAR(s.max, 4, kEps);
  EXPECT_NEAR(s.mean, 2.5, kEps);
  EXPECT_TRUE(std::isnan(summarize({}).p50));
}

TEST(LoadgenStats, HandComputedTrace) {
  const RunStats s = compute_stats(trace(), Slo{}, 4.0);
  EXPECT_EQ(s.issued, 5);
  EXPECT_EQ(s.completed, 4);
  EXPECT_EQ(s.failed, 1);
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_EQ(s.errors.at("http_429"), 1);
  EXPECT_EQ(s.output_tokens, 10);
  EXPECT_EQ(s.input_tokens, 32);
  EXPECT_NEAR(s.requests_per_s, 1.0, kEps);       // 4 / 4 s
  EXPECT_NEAR(s.output_tokens_per_s, 2.5, kEps);  // 10 / 4 s
  EXPECT_NEAR(s.input_tokens_per_s, 8.0, kEps);
  EXPECT_NEAR(s.goodput_requests_per_s, 1.0, kEps);  // no SLO: every completed request counts

  // TTFT {0.1, 0.3, 0.2, 0.5} -> sorted {0.1, 0.2, 0.3, 0.5}
  EXPECT_EQ(s.ttft.count, 4u);
  EXPECT_NEAR(s.ttft.p50, 0.25, kEps);
  EXPECT_NEAR(s.ttft.p90, 0.3 + 0.7 * 0.2, kEps);
  EXPECT_NEAR(s.ttft.p99, 0.3 + 0.97 * 0.2, kEps);
  EXPECT_NEAR(s.ttft.max, 0.5, kEps);
  EXPECT_NEAR(s.ttft.mean, 0.275, kEps);
  // E2E {0.2, 0.4, 0.6, 1.0}
  EXPECT_NEAR(s.e2e.p50, 0.5, kEps);
  EXPECT_NEAR(s.e2e.p90, 0.6 + 0.7 * 0.4, kEps);
  EXPECT_NEAR(s.e2e.p99, 0.6 + 0.97 * 0.4, kEps);
  EXPECT_NEAR(s.e2e.max, 1.0, kEps);
  // TPOT {0.1, 0.15, 0.5} (R2 has one token: none)
  EXPECT_EQ(s.tpot.count, 3u);
  EXPECT_NEAR(s.tpot.p50, 0.15, kEps);
  EXPECT_NEAR(s.tpot.p90, 0.15 + 0.8 * 0.35, kEps);
  EXPECT_NEAR(s.tpot.p99, 0.15 + 0.98 * 0.35, kEps);
  EXPECT_NEAR(s.tpot.max, 0.5, kEps);
  // ITL, every gap: {0.1, 0.1, 0.1, 0.1, 0.2, 0.5}
  EXPECT_EQ(s.itl.count, 6u);
  EXPECT_NEAR(s.itl.p50, 0.1, kEps);
  EXPECT_NEAR(s.itl.p90, 0.2 + 0.5 * 0.3, kEps);
  EXPECT_NEAR(s.itl.p99, 0.2 + 0.95 * 0.3, kEps);
  EXPECT_NEAR(s.itl.max, 0.5, kEps);
}

TEST(LoadgenStats, GoodputCountsRequestsMeetingEverySlo) {
  auto slo = parse_slo("ttft=350ms,tpot=0.2");
  ASSERT_TRUE(slo.is_ok()) << slo.status().message();
  // R0 (0.1, 0.15) R1 (0.3, 0.1) R2 (0.2, no TPOT) meet it; R4 (TTFT 0.5) does not.
  RunStats s = compute_stats(trace(), slo.value(), 4.0);
  EXPECT_EQ(s.slo_met, 3);
  EXPECT_NEAR(s.goodput_requests_per_s, 0.75, kEps);
  // Every gap <= 0.15 s: R1 and R2 (R0 has a 0.2 s gap, R4 0.5 s).
  s = compute_stats(trace(), parse_slo("itl=150ms").value(), 4.0);
  EXPECT_EQ(s.slo_met, 2);
  EXPECT_NEAR(s.goodput_requests_per_s, 0.5, kEps);
  // E2E <= 0.5 s: R0 and R2.
  s = compute_stats(trace(), parse_slo("e2e=0.5s").value(), 2.0);
  EXPECT_EQ(s.slo_met, 2);
  EXPECT_NEAR(s.goodput_requests_per_s, 1.0, kEps);
}

TEST(LoadgenStats, SloParsing) {
  const Slo s = parse_slo("ttft=500ms,tpot=50ms,itl=2000us,e2e=3").value();
  EXPECT_NEAR(*s.ttft_s, 0.5, kEps);
  EXPECT_NEAR(*s.tpot_s, 0.05, kEps);
  EXPECT_NEAR(*s.itl_s, 0.002, kEps);
  EXPECT_NEAR(*s.e2e_s, 3, kEps);
  EXPECT_TRUE(parse_slo("").value().empty());
  EXPECT_FALSE(parse_slo("ttft").is_ok());
  EXPECT_FALSE(parse_slo("latency=1").is_ok());
  EXPECT_FALSE(parse_slo("ttft=-1").is_ok());
  EXPECT_FALSE(parse_slo("ttft=5min").is_ok());
}

RunStats sweep_point(double rate, double ttft_p99, double tok_s) {
  RunStats s;
  s.rate = rate;
  s.ttft.count = 10;
  s.ttft.p99 = ttft_p99;
  s.output_tokens_per_s = tok_s;
  s.requests_per_s = tok_s / 10;
  return s;
}

TEST(LoadgenStats, ThroughputAtP99TtftInterpolatesTheCrossing) {
  const std::vector<RunStats> runs = {sweep_point(4, 0.6, 300), sweep_point(1, 0.1, 100), sweep_point(2, 0.2, 190)};
  // Objective 0.4 s: crossed between rate 2 (0.2 s) and rate 4 (0.6 s), halfway.
  SloThroughput t = throughput_at_p99_ttft(runs, 0.4);
  ASSERT_TRUE(t.found);
  EXPECT_NEAR(t.rate, 3, kEps);
  EXPECT_NEAR(t.output_tokens_per_s, 245, kEps);
  EXPECT_NEAR(t.requests_per_s, 24.5, kEps);
  // All runs meet 1 s: the best run.
  t = throughput_at_p99_ttft(runs, 1.0);
  EXPECT_NEAR(t.output_tokens_per_s, 300, kEps);
  // None meets 0.05 s.
  EXPECT_FALSE(throughput_at_p99_ttft(runs, 0.05).found);
}

TEST(LoadgenStats, JsonHasTheContractKeysAndRoundTrips) {
  const RunStats s = compute_stats(trace(), parse_slo("ttft=350ms").value(), 4.0);
  const nlohmann::json j = run_to_json(s);
  for (const char* key : {"rate", "completed", "failed", "errors", "requests_per_s", "output_tokens_per_s",
                          "goodput_requests_per_s", "ttft_s", "tpot_s", "itl_s", "e2e_s"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"ttft_s", "tpot_s", "itl_s", "e2e_s"}) {
    for (const char* p : {"p50", "p90", "p99", "max"}) EXPECT_TRUE(j[key][p].is_number()) << key << "." << p;
  }
  EXPECT_EQ(j["errors"]["http_429"], 1);
  const RunStats back = run_from_json(j).value();
  EXPECT_EQ(back.completed, 4);
  EXPECT_NEAR(back.ttft.p99, s.ttft.p99, kEps);
  EXPECT_NEAR(back.output_tokens_per_s, 2.5, kEps);
  // No samples: null, not a made-up number.
  const nlohmann::json empty = run_to_json(compute_stats({}, Slo{}, 1.0));
  EXPECT_TRUE(empty["ttft_s"]["p99"].is_null());
}

TEST(LoadgenStats, ServerCountersFromPrometheusText) {
  const std::string text =
      "# HELP tessera:generation_tokens_total Tokens generated.\n"
      "# TYPE tessera:generation_tokens_total counter\n"
      "tessera:generation_tokens_total{model_name=\"m\"} 1920\n"
      "tessera:prompt_tokens_total{model_name=\"m\"} 3840\n"
      "tessera:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 2\n"
      "tessera:request_success_total{model_name=\"m\",finished_reason=\"length\"} 58\n"
      "tessera:request_failure_total{model_name=\"m\"} 1\n"
      "tessera:http_responses_total{model_name=\"m\",code=\"200\"} 61\n"
      "tessera:http_responses_total{model_name=\"m\",code=\"429\"} 7\n"
      "tessera:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"0.1\"} 3\n";
  const ServerCounters c = parse_server_counters(text);
  EXPECT_TRUE(c.found);
  EXPECT_EQ(c.generation_tokens, 1920);
  EXPECT_EQ(c.prompt_tokens, 3840);
  EXPECT_EQ(c.request_success, 60);
  EXPECT_EQ(c.request_failure, 1);
  EXPECT_EQ(c.http_responses.at("429"), 7);
  const auto delta = nlohmann::json::parse(counters_delta_json(ServerCounters{}, c));
  EXPECT_EQ(delta["generation_tokens"], 1920);
  EXPECT_EQ(delta["http_responses"]["429"], 7);
  EXPECT_FALSE(parse_server_counters("up 1\n").found);
}

}  // namespace
}  // namespace tessera::loadgen
