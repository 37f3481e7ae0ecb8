// The Responses API over real HTTP (kjv-llama, CPU workers): a response says what the chat
// completion of the same conversation says (greedy), streamed as the Responses event sequence
// whose deltas add up to it; a forced function call comes back as a function_call item and its
// output, sent with previous_response_id, continues the stored conversation exactly as the chat
// messages would; text.format JSON schema gives JSON of the schema; stored responses are read
// back; bad fields are 400s naming them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

class ServeResponses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (testing::fixtures_dir().empty()) return;
    server_ = new testing::ServeProcess();
    if (!server_->start({"--model", testing::fixtures_dir() + "/kjv-llama", "--set", "server.tool_call_parser=hermes",
                         "--set", "cache.num_blocks=256"}))
      ADD_FAILURE() << server_->log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { TESSERA_REQUIRE_FIXTURES(); }

  static std::pair<int, json> post(const std::string& path, const json& body) {
    const std::string r = testing::http(server_->port(), "POST", path, body.dump());
    return {testing::http_status(r), json::parse(testing::http_body(r), nullptr, false)};
  }
  // The events of a Responses stream: (event type, data).
  static std::vector<std::pair<std::string, json>> stream(const json& body) {
    json b = body;
    b["stream"] = true;
    const std::string r = testing::http(server_->port(), "POST", "/v1/responses", b.dump());
    EXPECT_EQ(testing::http_status(r), 200) << r;
    std::vector<std::pair<std::string, json>> events;
    const std::regex event("event: ([a-z_.]+)\ndata: (\\{.*\\})\n");
    for (auto it = std::sregex_iterator(r.begin(), r.end(), event); it != std::sregex_iterator(); ++it)
      events.emplace_back((*it)[1].str(), json::parse((*it)[2].str()));
    return events;
  }
  static std::string output_text(const json& response) {
    std::string text;
    for (const json& item : response["output"])
      if (item["type"] == "message") text += item["content"][0]["text"].get<std::string>();
    return text;
  }
  static testing::ServeProcess* server_;
};
testing::ServeProcess* ServeResponses::server_ = nullptr;

const json kWeatherTool = json::parse(R"({"type": "function", "name": "get_weather",
  "description": "The weather in a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                 "required": ["city"]}})");

TEST_F(ServeResponses, AResponseSaysWhatTheChatCompletionSays) {
  const json body = {{"input", "And God said"}, {"instructions", "Speak as the scripture does."},
                     {"max_output_tokens", 12}, {"temperature", 0}};
  const auto [status, r] = post("/v1/responses", body);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(r["instructions"], "Speak as the scripture does.");
  const auto [chat_status, chat] = post("/v1/chat/completions",
      {{"messages", {{{"role", "system"}, {"content", "Speak as the scripture does."}}, {{"role", "user"}, {"content", "And God said"}}}},
       {"max_completion_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(chat_status, 200) << chat.dump();
  EXPECT_EQ(output_text(r), chat["choices"][0]["message"]["content"]);
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
  const bool cut = chat["choices"][0]["finish_reason"] == "length";
  EXPECT_EQ(r["status"], cut ? "incomplete" : "completed");
  if (cut) {
    EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  }

  // Streamed: the event sequence, its deltas adding up to the same text, the same final object.
  const auto events = stream(body);
  ASSERT_GE(events.size(), 8u);
  EXPECT_EQ(events[0].first, "response.created");
  EXPECT_EQ(events[1].first, "response.in_progress");
  EXPECT_EQ(events[2].first, "response.output_item.added");
  EXPECT_EQ(events[3].first, "response.content_part.added");
  EXPECT_EQ(events.back().first, cut ? "response.incomplete" : "response.completed");
  std::string deltas, done_text;
  std::vector<std::string> order;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].second["sequence_number"], i);
    EXPECT_EQ(events[i].second["type"], events[i].first);
    if (events[i].first == "response.output_text.delta") deltas += events[i].second["delta"].get<std::string>();
    if (events[i].first == "response.output_text.done") done_text = events[i].second["text"];
    if (order.empty() || order.back() != events[i].first) order.push_back(events[i].first);
  }
  EXPECT_EQ(deltas, output_text(r));
  EXPECT_EQ(done_text, deltas);
  const std::vector<std::string> tail(order.end() - 4, order.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"response.output_text.done", "response.content_part.done",
                                            "response.output_item.done", cut ? "response.incomplete" : "response.completed"}))
      << json(order).dump();
  const json& final_response = events.back().second["response"];
  EXPECT_EQ(output_text(final_response), output_text(r));
  EXPECT_EQ(final_response["output"][0]["id"], events[2].second["item"]["id"]);
}

TEST_F(ServeResponses, AFunctionCallRoundTripContinuesTheStoredConversation) {
  const json first_body = {{"input", "What is the weather in Zion?"}, {"tools", {kWeatherTool}},
                           {"tool_choice", "required"}, {"temperature", 0}, {"max_output_tokens", 200}};
  const auto [status, first] = post("/v1/responses", first_body);
  ASSERT_EQ(status, 200) << first.dump();
  EXPECT_EQ(first["status"], "completed") << first.dump();
  json call;
  for (const json& item : first["output"])
    if (item["type"] == "function_call") call = item;
  ASSERT_TRUE(call.is_object()) << first.dump();
  EXPECT_EQ(call["name"], "get_weather");
  const json args = json::parse(call["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object() && args["city"].is_string()) << call.dump();

  // Stored: read back whole.
  const std::string got = testing::http(server_->port(), "GET", "/v1/responses/" + first["id"].get<std::string>());
  ASSERT_EQ(testing::http_status(got), 200) << got;
  EXPECT_EQ(json::parse(testing::http_body(got)), first);

  // The function's output continues the conversation: the same as the chat messages.
  const json second_body = {{"previous_response_id", first["id"]},
                            {"input", {{{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "Sunny, 21 C"}}}},
                            {"tools", {kWeatherTool}}, {"temperature", 0}, {"max_output_tokens", 10}};
  const auto [status2, second] = post("/v1/responses", second_body);
  ASSERT_EQ(status2, 200) << second.dump();
  EXPECT_EQ(second["previous_response_id"], first["id"]);
  const json chat_tool = {{"type", "function"},
                          {"function", {{"name", "get_weather"}, {"description", kWeatherTool["description"]},
                                        {"parameters", kWeatherTool["parameters"]}}}};
  const json messages = {
      {{"role", "user"}, {"content", "What is the weather in Zion?"}},
      {{"role", "assistant"}, {"content", ""},
       {"tool_calls", {{{"id", call["call_id"]}, {"type", "function"},
                        {"function", {{"name", "get_weather"}, {"arguments", call["arguments"]}}}}}}},
      {{"role", "tool"}, {"tool_call_id", call["call_id"]}, {"content", "Sunny, 21 C"}}};
  const auto [chat_status, chat] =
      post("/v1/chat/completions", {{"messages", messages}, {"tools", {chat_tool}}, {"temperature", 0}, {"max_completion_tokens", 10}});
  ASSERT_EQ(chat_status, 200) << chat.dump();
  EXPECT_EQ(second["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  const json& m = chat["choices"][0]["message"];
  if (m["content"].is_string() && !m["content"].get<std::string>().empty()) {
    EXPECT_EQ(output_text(second), m["content"]);
  }

  // Streamed, the forced call comes as function_call_arguments deltas adding up to its arguments.
  const auto events = stream(first_body);
  std::string arguments, done_arguments;
  for (const auto& [type, data] : events) {
    if (type == "response.function_call_arguments.delta") arguments += data["delta"].get<std::string>();
    if (type == "response.function_call_arguments.done") done_arguments = data["arguments"];
  }
  EXPECT_EQ(arguments, call["arguments"]);
  EXPECT_EQ(done_arguments, call["arguments"]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "response.completed");
}

TEST_F(ServeResponses, TextFormatJsonSchemaGivesJsonOfTheSchema) {
  const json schema = {{"type", "object"},
                       {"properties", {{"book", {{"type", "string"}, {"maxLength", 10}}}, {"chapter", {{"type", "integer"}}}}},
                       {"required", {"book", "chapter"}},
                       {"additionalProperties", false}};
  const auto [status, r] = post("/v1/responses", {{"input", "Name a chapter."},
                                                  {"text", {{"format", {{"type", "json_schema"}, {"name", "ref"}, {"schema", schema}}}}},
                                                  {"temperature", 0}, {"max_output_tokens", 48}});
  ASSERT_EQ(status, 200) << r.dump();
  const json answer = json::parse(output_text(r), nullptr, false);
  ASSERT_TRUE(answer.is_object()) << r.dump();
  EXPECT_TRUE(answer["book"].is_string() && answer["chapter"].is_number_integer()) << answer.dump();
  EXPECT_EQ(r["text"]["format"]["type"], "json_schema");
}

TEST_F(ServeResponses, StoreAndBadFields) {
  const auto [status, unstored] = post("/v1/responses", {{"input", "In the beginning"}, {"store", false}, {"max_output_tokens", 2}});
  ASSERT_EQ(status, 200) << unstored.dump();
  const std::string gone = testing::http(server_->port(), "GET", "/v1/responses/" + unstored["id"].get<std::string>());
  EXPECT_EQ(testing::http_status(gone), 404) << gone;
  const auto [missing_status, missing] =
      post("/v1/responses", {{"input", "x"}, {"previous_response_id", unstored["id"]}});
  EXPECT_EQ(missing_status, 404) << missing.dump();
  EXPECT_EQ(missing["error"]["param"], "previous_response_id");
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"input", "x"}, {"background", true}}, "background"},
           {{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools[0].type"},
           {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}}, "input[0].content[0].type"},
           {{{"input", {{{"type", "computer_call"}}}}}, "input[0].type"},
           {{{"input", "x"}, {"temperature", 3}}, "temperature"},
           {{{"input", "x"}, {"truncation", "auto"}}, "truncation"},
           {{{"input", "x"}, {"text", {{"format", {{"type", "xml"}}}}}}, "text.format.type"},
           {json::object(), "input"}}) {
    const auto [s, e] = post("/v1/responses", body);
    EXPECT_EQ(s, 400) << body.dump() << " " << e.dump();
    EXPECT_EQ(e["error"]["param"], param) << body.dump() << " " << e.dump();
  }
}

}  // namespace
}  // namespace tessera
