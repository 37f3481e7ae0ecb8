// tessera-loadgen's request generation and arrival schedules: the same seed gives the same
// requests and arrival times (request i does not depend on how many are asked for), lengths
// follow their distributions, Poisson gaps have the right mean (within a statistical
// bound), bursts arrive together; plus the request bodies and the stream-chunk reader.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "tests/test_support.h"
#include "tools/loadgen/arrival.h"
#include "tools/loadgen/openai_request.h"
#include "tools/loadgen/target_check.h"
#include "tools/loadgen/workload.h"

namespace tessera::loadgen {
namespace {

WorkloadOptions options(const std::string& in, const std::string& out, uint64_t seed) {
  WorkloadOptions o;
  o.input_len = parse_length("--input-len", in).value();
  o.output_len = parse_length("--output-len", out).value();
  o.seed = seed;
  return o;
}

TEST(LoadgenWorkload, SameSeedSameRequests) {
  const Workload a(options("uniform:16:128", "lognormal:32:0.5", 7));
  const Workload b(options("uniform:16:128", "lognormal:32:0.5", 7));
  const Workload c(options("uniform:16:128", "lognormal:32:0.5", 8));
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    const RequestSpec x = a.request(i), y = b.request(i), z = c.request(i);
    EXPECT_EQ(x.prompt_ids, y.prompt_ids);
    EXPECT_EQ(x.output_len, y.output_len);
    EXPECT_EQ(static_cast<int>(x.prompt_ids.size()), x.input_len);  // token-id prompts are exact
    if (x.prompt_ids != z.prompt_ids) ++differ;
  }
  EXPECT_GE(differ, 49);
  // Request 10 is the same whatever was drawn before it.
  EXPECT_EQ(Workload(options("uniform:16:128", "8", 7)).request(10).prompt_ids, a.request(10).prompt_ids);
}

TEST(LoadgenWorkload, LengthsFollowTheirDistributions) {
  const Workload fixed(options("64", "32", 1));
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(fixed.request(i).input_len, 64);
    EXPECT_EQ(fixed.request(i).output_len, 32);
    for (int32_t id : fixed.request(i).prompt_ids) {
      EXPECT_GE(id, 10);
      EXPECT_LE(id, 500);
    }
  }
  const Workload mixed(options("uniform:10:20", "lognormal:100:0.5:400", 2));
  std::vector<int> outs;
  int lo_seen = 0, hi_seen = 0;
  for (int i = 0; i < 2000; ++i) {
    const RequestSpec r = mixed.request(i);
    EXPECT_GE(r.input_len, 10);
    EXPECT_LE(r.input_len, 20);
    lo_seen += r.input_len == 10;
    hi_seen += r.input_len == 20;
    EXPECT_GE(r.output_len, 1);
    EXPECT_LE(r.output_len, 400);
    outs.push_back(r.output_len);
  }
  EXPECT_GT(lo_seen, 0);
  EXPECT_GT(hi_seen, 0);
  std::sort(outs.begin(), outs.end());
  EXPECT_NEAR(outs[outs.size() / 2], 100, 8);  // the median of a log-normal is its scale

  WorkloadOptions words = options("12", "4", 3);
  words.text_prompts = true;
  const RequestSpec w = Workload(words).request(0);
  EXPECT_TRUE(w.prompt_ids.empty());
  EXPECT_EQ(std::count(w.prompt_text.begin(), w.prompt_text.end(), ' '), 11);

  EXPECT_FALSE(parse_length("--input-len", "0").is_ok());
  EXPECT_FALSE(parse_length("--input-len", "uniform:5:2").is_ok());
  EXPECT_FALSE(parse_length("--input-len", "lognormal:10").is_ok());
  EXPECT_FALSE(parse_length("--input-len", "zipf:1:2").is_ok());
}

TEST(LoadgenWorkload, DatasetInOrderWithItsOutputLengths) {
  const std::string dir = testing::make_temp_dir("loadgen-dataset");
  testing::write_file(dir + "/d.jsonl",
                      "{\"prompt\": \"In the beginning\", \"output_len\": 5}\n\n"
                      "{\"prompt\": [1, 2, 3]}\n"
                      "{\"prompt\": \"And God said\", \"max_tokens\": 9}\n");
  auto entries = read_dataset(dir + "/d.jsonl");
  ASSERT_TRUE(entries.is_ok()) << entries.status().message();
  const Workload w(options("64", "7", 0), entries.value());
  EXPECT_EQ(w.request(0).prompt_text, "In the beginning");
  EXPECT_EQ(w.request(0).output_len, 5);
  EXPECT_EQ(w.request(1).prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(w.request(1).output_len, 7);  // from --output-len
  EXPECT_EQ(w.request(2).output_len, 9);
  EXPECT_EQ(w.request(3).prompt_text, "In the beginning");  // cycles
  testing::write_file(dir + "/bad.jsonl", "{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n");
  auto bad = read_dataset(dir + "/bad.jsonl");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:2"), std::string::npos) << bad.status().message();
  std::filesystem::remove_all(dir);
}

TEST(LoadgenArrival, PoissonReproducibleWithTheRightMeanGap) {
  const ArrivalOptions o{ArrivalKind::kPoisson, 20.0, 1, 42};
  const std::vector<double> a = arrival_times(o, 4000), b = arrival_times(o, 4000);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.front(), 0);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_NE(arrival_times({ArrivalKind::kPoisson, 20.0, 1, 43}, 10), std::vector<double>(a.begin(), a.begin() + 10));
  // 3999 exponential gaps of mean 0.05 s: their mean has standard deviation 0.05 / sqrt(3999)
  // = 0.00079 s; allow 5 of them.
  const double mean_gap = a.back() / 3999.0;
  EXPECT_NEAR(mean_gap, 0.05, 5 * 0.05 / std::sqrt(3999.0));
  // Exponential: the gaps' standard deviation equals their mean (within 10%).
  double var = 0;
  for (size_t i = 1; i < a.size(); ++i) var += std::pow(a[i] - a[i - 1] - mean_gap, 2);
  EXPECT_NEAR(std::sqrt(var / 3998.0), 0.05, 0.005);
}

TEST(LoadgenArrival, ConstantAndBursts) {
  const std::vector<double> c = arrival_times({ArrivalKind::kConstant, 4.0, 1, 0}, 5);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(c[i], 0.25 * i, 1e-12);
  // Bursts of 3 at rate 6: a burst every 0.5 s.
  const std::vector<double> b = arrival_times({ArrivalKind::kConstant, 6.0, 3, 0}, 7);
  const std::vector<double> want = {0, 0, 0, 0.5, 0.5, 0.5, 1.0};
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(b[i], want[i], 1e-12);
  const std::vector<double> pb = arrival_times({ArrivalKind::kPoisson, 10.0, 4, 5}, 4000);
  for (size_t i = 0; i < pb.size(); i += 4) {
    for (size_t k = 1; k < 4 && i + k < pb.size(); ++k) EXPECT_EQ(pb[i + k], pb[i]);
  }
  EXPECT_NEAR(pb.back() / 999.0, 0.4, 5 * 0.4 / std::sqrt(999.0));  // 999 gaps of mean 4 / 10 s
}

TEST(LoadgenRequest, BodyAndStreamChunks) {
  RequestSpec spec;
  spec.prompt_ids = {5, 6, 7};
  spec.output_len = 12;
  RequestFormat f;
  f.model = "m";
  const auto j = nlohmann::json::parse(request_json(spec, f, true));
  EXPECT_EQ(j["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(j["max_tokens"], 12);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["model"], "m");
  EXPECT_FALSE(nlohmann::json::parse(request_json(spec, f, false)).contains("stream"));

  StreamChunk c = parse_stream_chunk(R"({"choices":[{"index":0,"text":" the","finish_reason":null}]})", false);
  EXPECT_TRUE(c.valid);
  EXPECT_EQ(c.tokens, 1);
  EXPECT_FALSE(c.finished);
  c = parse_stream_chunk(R"({"choices":[{"index":0,"text":"","logprobs":{"tokens":["a","b"]},"finish_reason":"length"}]})",
                         false);
  EXPECT_EQ(c.tokens, 2);
  EXPECT_EQ(c.finish_reason, "length");
  c = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", true);
  EXPECT_EQ(c.tokens, 0);  // the role chunk is not a token
  c = parse_stream_chunk(R"({"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}})", false);
  EXPECT_EQ(*c.prompt_tokens, 9);
  EXPECT_EQ(*c.completion_tokens, 4);
  c = parse_stream_chunk(R"({"error":{"message":"boom","type":"server_error"}})", false);
  EXPECT_EQ(*c.error, "boom");
  EXPECT_FALSE(parse_stream_chunk("not json", false).valid);
}

TEST(LoadgenTarget, OnlyLoopbackWithoutAllowRemote) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.3.2.1"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_FALSE(is_loopback_host("192.0.2.1"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
  EXPECT_TRUE(check_http_target("http://127.0.0.1:8000", false).is_ok());
  EXPECT_TRUE(check_http_target("http://[::1]:8000", false).is_ok());
  const Status remote = check_http_target("http://192.0.2.1:8000", false);
  ASSERT_FALSE(remote.is_ok());
  EXPECT_NE(remote.message().find("--allow-remote"), std::string::npos);
  EXPECT_TRUE(check_http_target("http://192.0.2.1:8000", true).is_ok());
  EXPECT_TRUE(check_zmq_target("ipc:///tmp/x.ipc", false).is_ok());
  EXPECT_TRUE(check_zmq_target("tcp://127.0.0.1:5555", false).is_ok());
  EXPECT_FALSE(check_zmq_target("tcp://192.0.2.1:5555", false).is_ok());
  EXPECT_TRUE(check_zmq_target("tcp://192.0.2.1:5555", true).is_ok());
}

}  // namespace
}  // namespace tessera::loadgen
