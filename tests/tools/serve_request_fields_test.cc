// Issue 15's request fields against a real tessera-serve child (kjv-llama, CPU workers) over
// loopback: each implemented field shown to change the output as it should, each refused
// one a 400 naming it, and echo + logprobs checked against tessera-generate --dump-logits.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::http;

const char* const kPrompt = "And the LORD said unto Moses,";

json body_json(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return json::parse(at == std::string::npos ? "" : response.substr(at + 4), nullptr, false);
}

// The events of a streamed response (chunk-size lines and [DONE] skipped).
std::vector<json> events_of(const std::string& response) {
  std::vector<json> out;
  std::istringstream in(response);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data: {", 0) == 0) out.push_back(json::parse(line.substr(6)));
  }
  return out;
}

class ServeFields : public testing::KjvServeSuite {
 protected:
  static std::string post(const json& body, const char* path = "/v1/completions") {
    return http(server_->port(), "POST", path, body.dump());
  }
  // A 200's body; fails the test otherwise.
  static json complete(const json& body) {
    const std::string r = post(body);
    EXPECT_EQ(testing::http_status(r), 200) << body.dump() << "\n" << r;
    return body_json(r);
  }
  static json greedy(int max_tokens) {
    return {{"prompt", kPrompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  }

  // tessera-generate on the same model: the prompt's ids and the greedy continuation's.
  static json generate(const std::string& args) {
    auto r = testing::run_command(testing::bin_dir() + "/tessera-generate --model " +
                                  testing::shell_quote(kjv_model()) + " --json " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }
};

TEST_F(ServeFields, LogitBiasMinus100RemovesTheGreedyTokenAndPlus100ForcesOne) {
  const json ref = generate("--prompt " + testing::shell_quote(kPrompt) + " --max-new-tokens 8");
  ASSERT_EQ(ref["output_ids"].size(), 8u);
  const int banned = ref["output_ids"][0];
  json req = greedy(8);
  req["logprobs"] = 0;
  const json plain = complete(req);
  const std::string banned_text = plain["choices"][0]["logprobs"]["tokens"][0];
  req["logit_bias"] = {{std::to_string(banned), -100}};
  const json biased = complete(req);
  const json& tokens = biased["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 8u);
  for (const json& t : tokens) EXPECT_NE(t.get<std::string>(), banned_text) << biased.dump();
  EXPECT_NE(biased["choices"][0]["text"], plain["choices"][0]["text"]);

  // +100 on one token: greedy picks it at every position.
  const int forced = ref["output_ids"][3];
  req["logit_bias"] = {{std::to_string(forced), 100}};
  const json f = complete(req);
  const std::string forced_text = plain["choices"][0]["logprobs"]["tokens"][3];
  for (const json& t : f["choices"][0]["logprobs"]["tokens"]) EXPECT_EQ(t.get<std::string>(), forced_text) << f.dump();

  // Out of the vocabulary, or out of range: 400 naming the field.
  req["logit_bias"] = {{"1024", 1}};
  const std::string r = post(req);
  EXPECT_EQ(testing::http_status(r), 400) << r;
  EXPECT_EQ(body_json(r)["error"]["param"], "logit_bias") << r;
  req["logit_bias"] = {{"5", -100.5}};
  EXPECT_EQ(body_json(post(req))["error"]["param"], "logit_bias.5");
}

// echo + logprobs scores every prompt token in the same prefill: each equals the log-softmax,
// at that token, of the last-position logits tessera-generate dumps for the prompt's prefix.
TEST_F(ServeFields, EchoLogprobsEqualGenerateDumpLogitsOfEachPrefix) {
  const std::vector<int32_t> prompt = generate("--prompt " + testing::shell_quote(kPrompt) +
                                               " --max-new-tokens 1")["prompt_ids"];
  ASSERT_GE(prompt.size(), 4u);
  const std::string dir = testing::make_temp_dir("tessera-echo-logprobs");
  std::vector<double> ref(prompt.size(), 0.0);
  std::vector<int32_t> ref_top(prompt.size(), -1);
  for (size_t p = 1; p < prompt.size(); ++p) {
    std::string ids;
    for (size_t i = 0; i < p; ++i) ids += (i ? "," : "") + std::to_string(prompt[i]);
    const std::string path = dir + "/prefix" + std::to_string(p) + ".f32";
    generate("--prompt-ids " + ids + " --max-new-tokens 1 --dump-logits " + testing::shell_quote(path));
    const std::vector<float> row = testing::read_f32_file(path);
    ASSERT_EQ(row.size(), 1024u);
    const float mx = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (float v : row) z += std::exp(static_cast<double>(v - mx));
    ref[p] = row[static_cast<size_t>(prompt[p])] - (mx + std::log(z));
    ref_top[p] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }

  json req = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"echo", true}, {"logprobs", 1},
              {"ignore_eos", true}};
  // Twice: the second finds the prompt in the prefix cache, and still scores all of it.
  for (int round = 0; round < 2; ++round) {
    const json j = complete(req);
    const json& lp = j["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), prompt.size() + 4) << j.dump();
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    for (size_t p = 1; p < prompt.size(); ++p) {
      ASSERT_TRUE(lp["token_logprobs"][p].is_number()) << p << ": " << j.dump();
      EXPECT_NEAR(lp["token_logprobs"][p].get<double>(), ref[p], 1e-3) << "prompt position " << p;
      ASSERT_EQ(lp["top_logprobs"][p].size(), 1u);
    }
    // The top alternative at a position where the prompt token is the model's own argmax is
    // that token itself, with the same logprob.
    for (size_t p = 1; p < prompt.size(); ++p) {
      if (ref_top[p] != prompt[p]) continue;
      EXPECT_NEAR(lp["top_logprobs"][p][lp["tokens"][p].get<std::string>()].get<double>(), ref[p], 1e-3);
    }
    // text_offset: the prompt tokens' from 0, the generated ones' after the echoed text.
    size_t expect = 0;
    for (size_t p = 0; p < prompt.size(); ++p) {
      EXPECT_EQ(lp["text_offset"][p], expect);
      expect += lp["tokens"][p].get<std::string>().size();
    }
    const std::string text = j["choices"][0]["text"];
    ASSERT_FALSE(lp["text_offset"][prompt.size()].is_null());
    size_t gen = lp["text_offset"][prompt.size()];
    for (size_t k = prompt.size(); k < prompt.size() + 4; ++k) {
      EXPECT_EQ(lp["text_offset"][k], gen);
      gen += lp["tokens"][k].get<std::string>().size();
    }

    // Streamed: the same tokens, logprobs and offsets, gathered over the chunks.
    json sreq = req;
    sreq["stream"] = true;
    json tokens = json::array(), logprobs = json::array(), offsets = json::array();
    std::string streamed_text;
    for (const json& ev : events_of(post(sreq))) {
      const json& c = ev["choices"][0];
      streamed_text += c["text"].get<std::string>();
      if (c["logprobs"].is_null()) continue;
      for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
      for (const json& t : c["logprobs"]["token_logprobs"]) logprobs.push_back(t);
      for (const json& t : c["logprobs"]["text_offset"]) offsets.push_back(t);
    }
    EXPECT_EQ(streamed_text, text);
    EXPECT_EQ(tokens, lp["tokens"]);
    EXPECT_EQ(offsets, lp["text_offset"]);
    ASSERT_EQ(logprobs.size(), lp["token_logprobs"].size());
    EXPECT_TRUE(logprobs[0].is_null());
    for (size_t k = 1; k < logprobs.size(); ++k)
      EXPECT_NEAR(logprobs[k].get<double>(), lp["token_logprobs"][k].get<double>(), 1e-5) << k;
  }
}

TEST_F(ServeFields, StreamingTextOffsetRunsOnAcrossChunks) {
  json req = greedy(6);
  req["logprobs"] = 0;
  const json whole = complete(req);
  req["stream"] = true;
  json offsets = json::array();
  for (const json& ev : events_of(post(req))) {
    const json& lp = ev["choices"][0]["logprobs"];
    if (!lp.is_null())
      for (const json& o : lp["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(offsets, whole["choices"][0]["logprobs"]["text_offset"]);
  EXPECT_EQ(offsets.size(), 6u);
  EXPECT_GT(offsets.back().get<int>(), 0);
}

// best_of candidates are the n = best_of choices of the same seed (choice c draws with seed
// + c); the one returned is the candidate with the highest cumulative logprob.
TEST_F(ServeFields, BestOfReturnsTheCandidateWithTheHighestCumulativeLogprob) {
  json req = {{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 1.0}, {"seed", 7}, {"logprobs", 0},
              {"ignore_eos", true}, {"n", 4}};
  const json all = complete(req);
  ASSERT_EQ(all["choices"].size(), 4u);
  double best = -1e30;
  std::string best_text;
  for (const json& c : all["choices"]) {
    double sum = 0;
    for (const json& l : c["logprobs"]["token_logprobs"]) sum += l.get<double>();
    if (sum > best) best = sum, best_text = c["text"];
  }
  req["n"] = 1;
  req["best_of"] = 4;
  const json one = complete(req);
  ASSERT_EQ(one["choices"].size(), 1u);
  EXPECT_EQ(one["choices"][0]["text"], best_text) << all.dump() << "\n" << one.dump();
  EXPECT_EQ(one["usage"]["completion_tokens"], 6);

  req["stream"] = true;
  EXPECT_EQ(body_json(post(req))["error"]["param"], "best_of");
  req["stream"] = false;
  req["n"] = 5;
  EXPECT_EQ(body_json(post(req))["error"]["param"], "best_of");
}

TEST_F(ServeFields, MinTokensKeepsStopTokensAndStopStringsFromEndingEarly) {
  const json ref = generate("--prompt " + testing::shell_quote(kPrompt) + " --max-new-tokens 8");
  const int first = ref["output_ids"][0];
  json req = greedy(8);
  req["stop_token_ids"] = {first};
  const json stopped = complete(req);
  EXPECT_EQ(stopped["usage"]["completion_tokens"], 1) << stopped.dump();
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  req["min_tokens"] = 4;
  const json held = complete(req);
  EXPECT_GE(held["usage"]["completion_tokens"].get<int>(), 4) << held.dump();

  // A stop string the greedy text contains at its start: not before min_tokens tokens.
  const std::string text = complete(greedy(8))["choices"][0]["text"];
  ASSERT_GE(text.size(), 3u);
  json sreq = greedy(8);
  sreq["stop"] = text.substr(0, 3);
  EXPECT_EQ(complete(sreq)["choices"][0]["text"], "");
  sreq["min_tokens"] = 8;
  EXPECT_EQ(complete(sreq)["choices"][0]["text"], text);  // no stop can end it before 8 tokens
  sreq["min_tokens"] = 9;
  EXPECT_EQ(body_json(post(sreq))["error"]["param"], "min_tokens");
}

TEST_F(ServeFields, IncludeStopStrInOutputKeepsTheMatchedStopString) {
  const std::string text = complete(greedy(12))["choices"][0]["text"];
  ASSERT_GE(text.size(), 10u);
  const std::string stop = text.substr(5, 3);
  const size_t at = text.find(stop);
  json req = greedy(12);
  req["stop"] = stop;
  const json without = complete(req);
  EXPECT_EQ(without["choices"][0]["text"], text.substr(0, at));
  EXPECT_EQ(without["choices"][0]["finish_reason"], "stop");
  req["include_stop_str_in_output"] = true;
  const json with = complete(req);
  EXPECT_EQ(with["choices"][0]["text"], text.substr(0, at + stop.size()));
  // Streamed too.
  req["stream"] = true;
  std::string streamed;
  for (const json& ev : events_of(post(req))) streamed += ev["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, text.substr(0, at + stop.size()));
}

TEST_F(ServeFields, UnimplementedFieldsAre400NamingThem) {
  const json chat_base = {{"messages", {{{"role", "user"}, {"content", "Blessed are the"}}}}, {"max_tokens", 4}};
  const std::vector<std::pair<std::string, json>> chat_cases = {
      {"response_format", {{"type", "bogus"}}},
      // Structured output is served (serve_structured_output_test.cc); what it cannot do is a 400.
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"not", json::object()}}}}}}},
      {"tools", "get_weather"},  // tools are served (tool_calls_http_test.cc); a malformed list is a 400
      {"tool_choice", "required"},  // without tools (forced calls: serve_tool_choice_test.cc)
      {"guided_json", {{"type", "object"}, {"patternProperties", json::object()}}},
      {"guided_choice", json::array()},
      {"guided_decoding_backend", "outlines"},
  };
  for (const auto& [field, value] : chat_cases) {
    json req = chat_base;
    req[field] = value;
    const std::string r = post(req, "/v1/chat/completions");
    EXPECT_EQ(testing::http_status(r), 400) << field << ": " << r;
    EXPECT_EQ(body_json(r)["error"]["param"], field) << r;
  }
  const std::vector<std::pair<std::string, json>> completion_cases = {
      {"suffix", " and the end"}, {"guided_regex", "(?=a)"}, {"guided_grammar", "root ::= a"},
      {"prompt_logprobs", 1},     {"not_a_field", true},  {"structured_outputs", {{"regex", "a+"}}},
  };
  for (const auto& [field, value] : completion_cases) {
    json req = greedy(4);
    req[field] = value;
    const std::string r = post(req);
    EXPECT_EQ(testing::http_status(r), 400) << field << ": " << r;
    EXPECT_EQ(body_json(r)["error"]["param"], field) << r;
  }
  // The no-op values are served.
  json ok = chat_base;
  ok["tools"] = json::array();
  ok["tool_choice"] = "none";
  ok["response_format"] = {{"type", "text"}};
  EXPECT_EQ(testing::http_status(post(ok, "/v1/chat/completions")), 200);
}

}  // namespace
}  // namespace tessera
