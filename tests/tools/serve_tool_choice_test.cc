// Forced tool calls (tool_choice "required" / a named function) through a real tessera-serve
// child (kjv-llama, CPU workers) over real sockets, once per tool-call parser (set with
// server.tool_call_parser): seeded temperature-1 samples are decoded under the call grammar
// and come back as OpenAI tool_calls whose arguments follow the function's schema; a named
// function is always the one called; greedy streams the same calls it answers whole; and
// the refusals are 400s naming the field and the problem.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <set>
#include <string>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::http;

const json& serve_tools() {
  static const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "smite", "parameters": {"type": "object",
      "properties": {"whom": {"enum": ["Egypt", "Philistines"]}, "plagues": {"type": "array",
        "items": {"type": "string", "maxLength": 8}, "maxItems": 2}}, "required": ["whom"],
      "additionalProperties": false}}}])");
  return tools;
}

// The arguments hold the required keys with their types.
void expect_serve_arguments(const json& call) {
  const std::string name = call["function"]["name"];
  const json a = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(a.is_object()) << call;
  if (name == "get_weather") {
    EXPECT_TRUE(a.contains("city") && a["city"].is_string()) << call;
    EXPECT_TRUE(a.contains("days") && a["days"].is_number_integer() && a["days"] >= 1 && a["days"] <= 7) << call;
  } else {
    ASSERT_EQ(name, "smite") << call;
    EXPECT_TRUE(a.contains("whom") && (a["whom"] == "Egypt" || a["whom"] == "Philistines")) << call;
    if (a.contains("plagues")) { EXPECT_TRUE(a["plagues"].is_array() && a["plagues"].size() <= 2) << call; }
    for (auto it = a.begin(); it != a.end(); ++it) EXPECT_TRUE(it.key() == "whom" || it.key() == "plagues") << call;
  }
}

class ServeToolChoice : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    server_ = std::make_unique<testing::ServeProcess>();
    ASSERT_TRUE(server_->start({"--model", testing::fixtures_dir() + "/kjv-llama", "--set",
                                std::string("server.tool_call_parser=") + GetParam()}))
        << server_->log();
  }
  std::string post(const json& body) const {
    return http(server_->port(), "POST", "/v1/chat/completions", body.dump());
  }
  json ok(const json& body) const {
    const std::string r = post(body);
    EXPECT_EQ(testing::http_status(r), 200) << body.dump() << "\n" << r;
    return json::parse(testing::http_body(r), nullptr, false);
  }
  static json chat(json tool_choice, json extra = json::object()) {
    json b = {{"messages", {{{"role", "user"}, {"content", "What saith the weather in Goshen?"}}}},
              {"tools", serve_tools()}, {"tool_choice", std::move(tool_choice)}, {"max_tokens", 300}};
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    return b;
  }
  void expect_400(const json& body, const std::string& param, const std::string& says) const {
    const std::string r = post(body);
    EXPECT_EQ(testing::http_status(r), 400) << r;
    const json e = json::parse(testing::http_body(r), nullptr, false);
    EXPECT_EQ(e["error"]["param"], param) << r;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << r;
  }
  std::unique_ptr<testing::ServeProcess> server_;
};

// What a forced reply starts with in the format (a cut reply's content starts so too).
std::string forced_call_head(const std::string& parser) {
  if (parser == "hermes") return "<tool_call>\n{\"name\": \"";
  if (parser == "llama3_json") return "{\"name\": \"";
  return "[TOOL_CALLS][{\"name\": \"";
}

// `r`'s choices: each complete one ("tool_calls") holds valid calls only — `one` of them when
// set, of `only` when given — and no content; a cut one ("length") holds the start of calls
// as content (or the complete calls before the cut). Returns how many completed.
int expect_forced_choices(const json& r, const std::string& parser, bool one, const std::string& only,
                          std::set<std::string>* names) {
  int complete = 0;
  for (const json& c : r["choices"]) {
    const json& msg = c["message"];
    if (c["finish_reason"] == "length" && !msg.contains("tool_calls")) {
      EXPECT_EQ(msg["content"].get<std::string>().rfind(forced_call_head(parser), 0), 0u) << c;
      continue;
    }
    if (c["finish_reason"] == "tool_calls") ++complete;
    EXPECT_TRUE(c["finish_reason"] == "tool_calls" || c["finish_reason"] == "length") << c;
    EXPECT_TRUE(msg["content"].is_null()) << c;
    EXPECT_GE(msg["tool_calls"].size(), 1u) << c;
    if (one) { EXPECT_EQ(msg["tool_calls"].size(), 1u) << c; }
    for (const json& call : msg["tool_calls"]) {
      EXPECT_EQ(call["type"], "function");
      if (!only.empty()) { EXPECT_EQ(call["function"]["name"], only) << c; }
      names->insert(call["function"]["name"].get<std::string>());
      expect_serve_arguments(call);
    }
  }
  return complete;
}

// Seeded temperature-1 samples (n = 8 each; 4 under the sanitizers, whose pass looks for
// memory errors) of "required" with parallel_tool_calls false, of a named function, and of
// "required" with parallel calls. kjv-llama seldom ends a reply where a further call may
// follow (its EOS logit is low), so parallel samples are often cut by max_tokens; three in
// four one-call replies must complete.
TEST_P(ServeToolChoice, SeededSamplesAreValidCalls) {
  const std::string parser = GetParam();
  const int n = testing::kSanitizedBuild ? 4 : 8;
  std::set<std::string> names;
  const json one = ok(chat("required", {{"temperature", 1}, {"seed", 11}, {"n", n}, {"parallel_tool_calls", false}}));
  ASSERT_EQ(one["choices"].size(), static_cast<size_t>(n)) << one;
  EXPECT_GE(expect_forced_choices(one, parser, true, "", &names), n * 3 / 4) << one;
  const json named = ok(chat({{"type", "function"}, {"function", {{"name", "smite"}}}},
                             {{"temperature", 1}, {"seed", 12}, {"n", n}}));
  EXPECT_GE(expect_forced_choices(named, parser, true, "smite", &names), n * 3 / 4) << named;
  const json many = ok(chat("required", {{"temperature", 1}, {"seed", 13}, {"n", n}}));
  expect_forced_choices(many, parser, false, "", &names);
  EXPECT_EQ(names.size(), 2u) << "both functions are called";
}

TEST_P(ServeToolChoice, GreedyStreamEqualsTheWholeAnswer) {
  json b = chat("required", {{"temperature", 0}, {"parallel_tool_calls", false}});
  const json whole = ok(b)["choices"][0];
  ASSERT_EQ(whole["finish_reason"], "tool_calls") << whole;
  ASSERT_EQ(whole["message"]["tool_calls"].size(), 1u) << whole;
  b["stream"] = true;
  const std::string streamed = post(b);
  json calls = json::array();
  std::string finish;
  for (size_t at = 0; (at = streamed.find("data: {", at)) != std::string::npos;) {
    const size_t end = streamed.find('\n', at);
    const json ev = json::parse(streamed.substr(at + 6, end - at - 6), nullptr, false);
    at = end;
    if (!ev.contains("choices") || ev["choices"].empty()) continue;
    const json& choice = ev["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    if (choice["delta"].contains("content") && !choice["delta"]["content"].is_null()) {
      EXPECT_EQ(choice["delta"]["content"], "") << "no content in a forced call: " << ev;
    }
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const json& tc : choice["delta"]["tool_calls"]) {
      const size_t i = tc["index"];
      if (i == calls.size()) calls.push_back({{"name", tc["function"]["name"]}, {"arguments", ""}});
      ASSERT_LT(i, calls.size()) << ev;
      if (tc["function"].contains("arguments"))
        calls[i]["arguments"] = calls[i]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(finish, "tool_calls") << streamed;
  ASSERT_EQ(calls.size(), 1u) << streamed;
  EXPECT_EQ(calls[0]["name"], whole["message"]["tool_calls"][0]["function"]["name"]);
  EXPECT_EQ(calls[0]["arguments"], whole["message"]["tool_calls"][0]["function"]["arguments"]);
}

TEST_P(ServeToolChoice, RefusalsAre400sNamingTheProblem) {
  expect_400(chat({{"type", "function"}, {"function", {{"name", "part_the_sea"}}}}), "tool_choice", "'part_the_sea'");
  json no_tools = chat("required");
  no_tools.erase("tools");
  expect_400(no_tools, "tool_choice", "'tools'");
  json bad = chat("required");
  bad["tools"][1]["function"]["parameters"]["properties"]["plagues"]["uniqueItems"] = true;
  expect_400(bad, "tools[1].function.parameters", "unsupported keyword 'uniqueItems' at /properties/plagues");
  expect_400(chat("required", {{"response_format", {{"type", "json_object"}}}}), "tool_choice", "'response_format'");
  expect_400(chat({{"type", "function"}, {"function", {{"name", "smite"}}}}, {{"guided_choice", {"a", "b"}}}),
             "tool_choice", "'guided_choice'");
  // "auto" and "none" are as before: served, the text is the content here (no call written).
  EXPECT_EQ(testing::http_status(post(chat("none", {{"max_tokens", 4}}))), 200);
  EXPECT_EQ(testing::http_status(post(chat("auto", {{"max_tokens", 4}}))), 200);
}

INSTANTIATE_TEST_SUITE_P(Parsers, ServeToolChoice, ::testing::Values("hermes", "llama3_json", "mistral"));

TEST(ServeToolChoiceNone, ParserNoneRefusesAForcedCall) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--set", "server.tool_call_parser=none"}))
      << server.log();
  json b = {{"messages", {{{"role", "user"}, {"content", "Who smote Egypt?"}}}}, {"tools", serve_tools()},
            {"tool_choice", "required"}, {"max_tokens", 8}};
  const std::string r = http(server.port(), "POST", "/v1/chat/completions", b.dump());
  EXPECT_EQ(testing::http_status(r), 400) << r;
  const json e = json::parse(testing::http_body(r), nullptr, false);
  EXPECT_EQ(e["error"]["param"], "tool_choice") << r;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("server.tool_call_parser is none"), std::string::npos) << r;
}

}  // namespace
}  // namespace tessera
