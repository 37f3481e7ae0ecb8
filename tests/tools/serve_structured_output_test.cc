// Structured output through a real tessera-serve child (kjv-llama, CPU workers) over real
// sockets, REST and ZeroMQ: outputs follow the grammar (checked here with the matcher's own
// whole-string check and nlohmann's JSON parser; tests/e2e/structured_output_test.mjs
// validates with ajv), "stop" when the grammar completes, "length" when max_tokens cuts it,
// and every kind of bad constraint a 400 naming the field and the problem.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <set>
#include <string>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"
#include "tools/client/zmq_client.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::http;

const char* const kStructuredPrompt = "And the LORD said unto Moses,";

class ServeStructured : public testing::KjvServeSuite {
 protected:
  static std::string post(const json& body, const char* path = "/v1/completions") {
    return http(server_->port(), "POST", path, body.dump());
  }
  static json ok(const json& body, const char* path = "/v1/completions") {
    const std::string r = post(body, path);
    EXPECT_EQ(testing::http_status(r), 200) << body.dump() << "\n" << r;
    return json::parse(testing::http_body(r), nullptr, false);
  }
};

TEST_F(ServeStructured, JsonSchemaSamplesParseAndFollowTheSchema) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
      "required": ["name", "age"], "additionalProperties": false})");
  const json r = ok({{"prompt", kStructuredPrompt}, {"max_tokens", 200}, {"temperature", 1}, {"seed", 5}, {"n", 8},
                     {"guided_json", schema}});
  ASSERT_EQ(r["choices"].size(), 8u);
  int completed = 0;
  for (const json& c : r["choices"]) {
    if (c["finish_reason"] == "length") continue;
    ASSERT_EQ(c["finish_reason"], "stop") << c.dump();
    ++completed;
    const json doc = json::parse(c["text"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(doc.is_object()) << c["text"];
    ASSERT_TRUE(doc.contains("name") && doc["name"].is_string()) << doc.dump();
    EXPECT_TRUE(doc.contains("age") && doc["age"].is_number_integer() && doc["age"] >= 0 && doc["age"] <= 120) << doc.dump();
    for (auto it = doc.begin(); it != doc.end(); ++it) EXPECT_TRUE(it.key() == "name" || it.key() == "age" || it.key() == "tags");
  }
  EXPECT_GE(completed, 4) << r.dump();
  // The same through chat with response_format json_schema.
  const json chat = ok({{"messages", {{{"role", "user"}, {"content", "Who begat whom?"}}}}, {"max_tokens", 200},
                        {"temperature", 0},
                        {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}}}},
                       "/v1/chat/completions");
  const json& msg = chat["choices"][0];
  if (msg["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(msg["message"]["content"].get<std::string>(), nullptr, false).is_object()) << msg.dump();
  }
}

TEST_F(ServeStructured, RegexAndChoiceOutputsAllMatch) {
  const json rr = ok({{"prompt", kStructuredPrompt}, {"max_tokens", 24}, {"temperature", 1}, {"seed", 1}, {"n", 10},
                      {"guided_regex", "[A-Z][a-z]{1,6} \\d{1,2}:\\d{1,2}"}});
  const std::regex re("[A-Z][a-z]{1,6} \\d{1,2}:\\d{1,2}");
  for (const json& c : rr["choices"]) {
    EXPECT_EQ(c["finish_reason"], "stop") << c.dump();
    EXPECT_TRUE(std::regex_match(c["text"].get<std::string>(), re)) << c["text"];
  }
  const std::set<std::string> choices = {"Genesis", "Exodus", "Leviticus"};
  const json rc = ok({{"prompt", kStructuredPrompt}, {"max_tokens", 8}, {"temperature", 1}, {"seed", 2}, {"n", 10},
                      {"guided_choice", {"Genesis", "Exodus", "Leviticus"}}});
  for (const json& c : rc["choices"]) {
    EXPECT_EQ(c["finish_reason"], "stop") << c.dump();
    EXPECT_TRUE(choices.count(c["text"].get<std::string>())) << c["text"];
  }
  // json_object, greedy: an object, and the same text when streamed.
  json obj = {{"prompt", kStructuredPrompt}, {"max_tokens", 120}, {"temperature", 0}, {"response_format", {{"type", "json_object"}}}};
  const json ro = ok(obj);
  const std::string text = ro["choices"][0]["text"];
  if (ro["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
  }
  obj["stream"] = true;
  const std::string streamed = post(obj);
  std::string joined;
  for (size_t at = 0; (at = streamed.find("data: {", at)) != std::string::npos;) {
    const size_t end = streamed.find('\n', at);
    const json ev = json::parse(streamed.substr(at + 6, end - at - 6), nullptr, false);
    if (ev.contains("choices") && !ev["choices"].empty()) joined += ev["choices"][0].value("text", "");
    at = end;
  }
  EXPECT_EQ(joined, text);
  // max_tokens cuts the document: "length" (the client gets a truncated document).
  const json cut = ok({{"prompt", kStructuredPrompt}, {"max_tokens", 2}, {"temperature", 0},
                       {"guided_json", {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 5}}}});
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
}

TEST_F(ServeStructured, BadConstraintsAre400sNamingTheProblem) {
  struct Case {
    const char* field;
    json value;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"guided_json", {{"type", "strng"}}, "'type' must be one of"},
      {"guided_json", {{"type", "array"}, {"uniqueItems", true}}, "unsupported keyword 'uniqueItems'"},
      {"guided_json", {{"type", "object"}, {"properties", {{"a", {{"if", json::object()}}}}}}, "unsupported keyword 'if' at /properties/a"},
      {"guided_regex", "(ab", "missing ')'"},
      {"guided_regex", "(?<=a)b", "lookaround"},
      {"guided_grammar", "root ::= value", "rule 'value' is used by rule 'root' but never defined"},
      {"guided_grammar", "root ::= \"a\"\nlost ::= \"b\"", "rule 'lost' is never used"},
      {"guided_grammar", "root ::= \"a\" root", "accepts no string"},
      {"guided_choice", json::array(), "non-empty"},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"$ref", "#/$defs/x"}}}}}}, "does not resolve"},
  };
  for (const Case& c : cases) {
    const std::string r = post({{"prompt", kStructuredPrompt}, {"max_tokens", 4}, {c.field, c.value}});
    EXPECT_EQ(testing::http_status(r), 400) << c.field << ": " << r;
    const json e = json::parse(testing::http_body(r), nullptr, false);
    EXPECT_EQ(e["error"]["param"], c.field) << r;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(c.says), std::string::npos) << r;
  }
  const std::string two = post({{"prompt", kStructuredPrompt}, {"guided_regex", "a"}, {"guided_choice", {"a"}}});
  EXPECT_EQ(testing::http_status(two), 400) << two;
  EXPECT_NE(two.find("send only one"), std::string::npos) << two;
}

TEST_F(ServeStructured, ZeroMqClientsGetConstrainedOutputToo) {
  auto zc = ZmqClient::connect(server_->zmq_endpoint());
  ASSERT_TRUE(zc.is_ok()) << zc.status().to_string();
  const json req = {{"prompt", kStructuredPrompt}, {"max_tokens", 8}, {"temperature", 1}, {"seed", 3},
                    {"guided_choice", {"yea", "nay"}}};
  auto id = zc.value()->submit(ZmqRequestKind::kCompletion, req.dump());
  ASSERT_TRUE(id.is_ok());
  std::string text;
  for (;;) {
    auto ev = zc.value()->next_event(std::chrono::seconds(60));
    ASSERT_TRUE(ev.is_ok()) << ev.status().to_string();
    ASSERT_NE(ev->kind, ZmqClientEvent::Kind::kError) << ev->error_message;
    if (ev->kind == ZmqClientEvent::Kind::kFinal) {
      ASSERT_EQ(ev->finish_reasons.size(), 1u);
      EXPECT_EQ(ev->finish_reasons[0], "stop");
      break;
    }
    text += ev->text;
  }
  EXPECT_TRUE(text == "yea" || text == "nay") << text;
  auto bad = zc.value()->submit(ZmqRequestKind::kCompletion,
                                json{{"prompt", kStructuredPrompt}, {"guided_json", {{"not", json::object()}}}}.dump());
  ASSERT_TRUE(bad.is_ok());
  auto ev = zc.value()->next_event(std::chrono::seconds(60));
  ASSERT_TRUE(ev.is_ok());
  EXPECT_EQ(ev->kind, ZmqClientEvent::Kind::kError);
  EXPECT_EQ(ev->status, 400);
  EXPECT_EQ(ev->error_param, "guided_json");
  EXPECT_NE(ev->error_message.find("'not'"), std::string::npos) << ev->error_message;
}

}  // namespace
}  // namespace tessera
