// Speculative decoding over real HTTP: a server with n-gram proposals (two worker processes)
// answers exactly what a plain one-rank server answers — text, tokens' logprobs, finish reason
// and usage — for greedy and seeded requests, with a stop string, a max_tokens and EOS that
// may fall inside a step's proposals, and streamed; its /metrics count the accepted proposals.
// Then the same with a draft model proposing, also after one of its ranks was killed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

json post(int port, const json& body) {
  const std::string r = testing::http(port, "POST", "/v1/completions", body.dump());
  EXPECT_EQ(testing::http_status(r), 200) << r;
  return json::parse(testing::http_body(r), nullptr, false);
}

// The text of a streamed completion (SSE "data:" lines), and its finish reason.
std::pair<std::string, std::string> post_streamed(int port, json body) {
  body["stream"] = true;
  const std::string r = testing::http(port, "POST", "/v1/completions", body.dump());
  std::string text, reason;
  const std::regex data("data: (\\{.*\\})");
  for (auto it = std::sregex_iterator(r.begin(), r.end(), data); it != std::sregex_iterator(); ++it) {
    const json chunk = json::parse((*it)[1].str(), nullptr, false);
    if (!chunk.is_object() || chunk["choices"].empty()) continue;
    text += chunk["choices"][0].value("text", "");
    if (chunk["choices"][0]["finish_reason"].is_string()) reason = chunk["choices"][0]["finish_reason"];
  }
  return {text, reason};
}

void expect_same_choice(const json& spec, const json& plain, const std::string& what) {
  ASSERT_TRUE(spec.is_object() && plain.is_object()) << what;
  const json& a = spec["choices"][0];
  const json& b = plain["choices"][0];
  EXPECT_EQ(a["text"], b["text"]) << what;
  EXPECT_EQ(a["finish_reason"], b["finish_reason"]) << what;
  EXPECT_EQ(spec["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]) << what;
  if (b.contains("logprobs") && b["logprobs"].is_object()) {
    const json& la = a["logprobs"]["token_logprobs"];
    const json& lb = b["logprobs"]["token_logprobs"];
    ASSERT_EQ(la.size(), lb.size()) << what;
    for (size_t i = 0; i < lb.size(); ++i) EXPECT_NEAR(la[i].get<double>(), lb[i].get<double>(), 1e-3) << what << " token " << i;
    EXPECT_EQ(a["logprobs"]["tokens"], b["logprobs"]["tokens"]) << what;
  }
}

// kjv-llama served on one rank without speculation (`plain`) and on two with `spec_flags`.
void start_pair(testing::ServeProcess& plain, testing::ServeProcess& spec, const std::vector<std::string>& spec_flags) {
  const std::vector<std::string> common = {"--model", testing::fixtures_dir() + "/kjv-llama", "--dtype", "float32",
                                           "--backend", "cpu", "--threads", "1", "--set", "cache.num_blocks=256",
                                           "--set", "cache.block_size=4"};
  ASSERT_TRUE(plain.start(common)) << plain.log();
  std::vector<std::string> spec_args = common;
  spec_args.insert(spec_args.end(), {"--tensor-parallel", "2"});
  spec_args.insert(spec_args.end(), spec_flags.begin(), spec_flags.end());
  ASSERT_TRUE(spec.start(spec_args)) << spec.log();
}

// The server's /metrics text and its count of accepted proposals (-1 when absent).
std::pair<std::string, long long> accepted_proposals(int port) {
  const std::string metrics = testing::http_body(testing::http(port, "GET", "/metrics"));
  std::smatch m;
  if (!std::regex_search(metrics, m, std::regex("vllm:spec_decode_num_accepted_tokens_total(\\{[^}]*\\})? (\\d+)")))
    return {metrics, -1};
  return {metrics, std::stoll(m[2])};
}

// Under a JSON schema, proposals are cut where the grammar stops them and each checked row is
// masked by the grammar after the proposals before it: the plain server's answer, with
// proposals accepted for it. `prompt` shows the document so that its text is worth proposing.
json verse_schema() {
  return {{"type", "object"}, {"properties", {{"verse", {{"type", "string"}}}}}, {"required", json::array({"verse"})}};
}

void expect_constrained_matches(int spec_port, int plain_port, const std::string& prompt) {
  const json constrained = {{"prompt", prompt}, {"max_tokens", 48}, {"temperature", 0}, {"logprobs", 2},
                            {"guided_json", verse_schema()}};
  const long long before = accepted_proposals(spec_port).second;
  const json plain_out = post(plain_port, constrained);
  expect_same_choice(post(spec_port, constrained), plain_out, "JSON schema");
  EXPECT_GT(accepted_proposals(spec_port).second, before) << "no proposal accepted under the grammar";
}

// The greedy request, then with a stop string from the middle of its answer, a max_tokens of
// `short_max` and run to EOS — each may end the choice inside a step's accepted proposals —
// and streamed with the stop string: the speculating server answers as the plain one.
void expect_endings_match(int spec_port, int plain_port, const json& greedy, int short_max) {
  const json plain_out = post(plain_port, greedy);
  expect_same_choice(post(spec_port, greedy), plain_out, "greedy");
  const std::string text = plain_out["choices"][0]["text"];
  ASSERT_GT(text.size(), 30u) << text;
  json stopped = greedy;
  stopped["stop"] = json::array({text.substr(text.size() / 2, 6)});
  expect_same_choice(post(spec_port, stopped), post(plain_port, stopped), "stop string");
  json short_one = greedy;
  short_one["max_tokens"] = short_max;
  expect_same_choice(post(spec_port, short_one), post(plain_port, short_one), "max_tokens " + std::to_string(short_max));
  json with_eos = greedy;
  with_eos["prompt"] = "In the beginning";
  with_eos["max_tokens"] = 200;
  expect_same_choice(post(spec_port, with_eos), post(plain_port, with_eos), "to EOS");
  EXPECT_EQ(post_streamed(spec_port, stopped), post_streamed(plain_port, stopped));
}

TEST(ServeSpeculative, NgramProposalsAnswerExactlyWhatPlainDecodingAnswers) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess plain, spec;
  start_pair(plain, spec, {"--set", "speculative.method=ngram", "--set", "speculative.num_tokens=5"});
  if (HasFatalFailure()) return;

  // A passage quoted, then begun again: the continuation repeats it, so proposals are taken.
  const std::string verse =
      "And God said, Let there be light: and there was light. And God saw the light, that it was good: "
      "and God divided the light from the darkness.";
  const json greedy = {{"prompt", verse + " " + verse.substr(0, 40)}, {"max_tokens", 48}, {"temperature", 0},
                       {"logprobs", 2}};
  expect_endings_match(spec.port(), plain.port(), greedy, 7);
  expect_constrained_matches(spec.port(), plain.port(), "{\"verse\": \"" + verse + "\"}\n");

  // Seeded sampling draws the same tokens.
  json seeded = greedy;
  seeded["temperature"] = 0.8;
  seeded["seed"] = 11;
  expect_same_choice(post(spec.port(), seeded), post(plain.port(), seeded), "seeded");

  const auto [metrics, accepted] = accepted_proposals(spec.port());
  ASSERT_GE(accepted, 0) << metrics;
  EXPECT_GT(accepted, 0) << "no proposal was accepted";
  EXPECT_NE(metrics.find("vllm:spec_decode_num_accepted_tokens_per_pos_total"), std::string::npos);
}

// A draft model in the two worker processes (kjv-llama's trained draft fixture, split across
// the ranks with the target): greedy answers equal the plain server's, also where a stop
// string, max_tokens or EOS falls inside a step; a seeded sampled request repeats itself; the
// metrics count accepted proposals. A draft of another vocabulary stops start-up naming the
// key and both sizes.
TEST(ServeSpeculative, DraftModelAnswersGreedyExactlyAndSeededRepeatably) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess plain, spec;
  start_pair(plain, spec, {"--set", "speculative.method=draft", "--set",
                           "speculative.draft_model=" + testing::fixtures_dir() + "/kjv-llama-draft"});
  if (HasFatalFailure()) return;

  const json greedy = {{"prompt", "And it came to pass, when the king"}, {"max_tokens", 40}, {"temperature", 0},
                       {"logprobs", 2}};
  expect_endings_match(spec.port(), plain.port(), greedy, 6);
  expect_constrained_matches(spec.port(), plain.port(), "And it came to pass, when the king");

  json seeded = greedy;
  seeded["temperature"] = 0.9;
  seeded["seed"] = 5;
  const json first = post(spec.port(), seeded);
  expect_same_choice(post(spec.port(), seeded), first, "seeded, twice");
  // Sampled under a grammar (the rule's path: the first proposal the grammar stops on is sent
  // as the last): it repeats itself, and a complete answer is a document of the schema.
  json seeded_doc = seeded;
  seeded_doc["guided_json"] = verse_schema();
  seeded_doc["max_tokens"] = 120;
  const json doc = post(spec.port(), seeded_doc);
  expect_same_choice(post(spec.port(), seeded_doc), doc, "seeded under a grammar, twice");
  if (doc["choices"][0]["finish_reason"] == "stop") {
    const json parsed = json::parse(doc["choices"][0]["text"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(parsed.is_object() && parsed.contains("verse")) << doc.dump();
  }

  const auto [metrics, accepted] = accepted_proposals(spec.port());
  ASSERT_GE(accepted, 0) << metrics;
  EXPECT_GT(accepted, 0) << "no proposal was accepted";

  // tiny-llama's vocabulary has 512 ids, kjv-llama's 1,024.
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  const auto bad = testing::run_command(testing::bin_dir() + "/tessera-serve --model '" + model + "' --port 0 --set " +
                                        "speculative.method=draft --set 'speculative.draft_model=" +
                                        testing::fixtures_dir() + "/tiny-llama'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("speculative.draft_model"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("its vocabulary has 512 ids, the target's 1024"), std::string::npos) << bad.err;
}

// A rank of a draft-speculating server killed (kill -9): the group restarts, both ranks load
// target and draft again, and the server answers as before — the plain server's greedy text,
// with proposals accepted after the restart too.
TEST(ServeSpeculative, DraftServerAnswersAsBeforeAfterARankIsKilled) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess plain, spec;
  start_pair(plain, spec, {"--set", "speculative.method=draft", "--set",
                           "speculative.draft_model=" + testing::fixtures_dir() + "/kjv-llama-draft", "--set",
                           "server.heartbeat_ms=200", "--set", "server.worker_restart_wait_s=60"});
  if (HasFatalFailure()) return;
  const json greedy = {{"prompt", "And it came to pass, when the king"}, {"max_tokens", 40}, {"temperature", 0},
                       {"logprobs", 2}};
  const json reference = post(plain.port(), greedy);
  expect_same_choice(post(spec.port(), greedy), reference, "before the kill");
  const long long accepted_before = accepted_proposals(spec.port()).second;

  const pid_t rank1 = testing::worker_pid(spec, 1);
  ASSERT_GT(rank1, 0) << spec.log();
  kill(rank1, SIGKILL);
  auto ready_is = [&](int status) {
    for (int i = 0; i < 6000; ++i) {
      if (testing::http_status(testing::http(spec.port(), "GET", "/ready")) == status) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(ready_is(503)) << "the kill was never noticed\n" << spec.log();
  ASSERT_TRUE(ready_is(200)) << "the group never came back\n" << spec.log();
  EXPECT_NE(testing::worker_pid(spec, 1), rank1);

  expect_same_choice(post(spec.port(), greedy), reference, "after the restart");
  json other = greedy;
  other["prompt"] = "And God said unto Moses";
  expect_same_choice(post(spec.port(), other), post(plain.port(), other), "a new prompt after the restart");
  EXPECT_GT(accepted_proposals(spec.port()).second, accepted_before) << "no proposal accepted after the restart";
}

}  // namespace
}  // namespace tessera
