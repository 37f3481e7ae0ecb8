// The chat part of a request (coordinator/api/chat_request.h): every message field a template
// needs, carried as transformers passes it (arguments as an object, key order kept,
// developer as system, content parts joined), and a 400 naming each field a client gets wrong.
#include "coordinator/api/chat_request.h"

#include <gtest/gtest.h>

#include "coordinator/api/openai_api.h"
#include "coordinator/api/tool_calls/tool_call_stream.h"

namespace tessera {
namespace {

using ojson = nlohmann::ordered_json;

ChatRequestParts read_ok(const std::string& body) {
  ChatRequestParts parts;
  ApiError error;
  EXPECT_TRUE(read_chat_request(ojson::parse(body), &parts, &error)) << body << " -> " << error.message;
  return parts;
}

ApiError read_error(const std::string& body) {
  ChatRequestParts parts;
  ApiError error;
  EXPECT_FALSE(read_chat_request(ojson::parse(body), &parts, &error)) << body;
  EXPECT_EQ(error.http_status, 400) << body;
  return error;
}

TEST(ChatRequest, MessagesCarryEveryFieldTemplatesUse) {
  const ChatRequestParts p = read_ok(R"({"messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"z\": 1, \"a\": {\"b\": 2}}"}}]},
      {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "b": 1, "a": 2}}}],
    "parallel_tool_calls": false})");
  const ojson& m = p.context["messages"];
  EXPECT_EQ(m[0].dump(), R"({"role":"system","content":"Be brief."})");
  EXPECT_EQ(m[1].dump(), R"({"role":"user","content":"Weather in Paris?","name":"ann"})");
  // Arguments arrive as JSON text and reach the template as the object, in the client's order.
  EXPECT_EQ(m[2].dump(),
            R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"z":1,"a":{"b":2}}}}]})");
  EXPECT_EQ(m[3].dump(), R"({"role":"tool","content":"sunny","name":"get_weather","tool_call_id":"c1"})");
  EXPECT_EQ(p.context["tools"][0]["function"]["parameters"].dump(), R"({"type":"object","b":1,"a":2})");
  EXPECT_TRUE(p.context["documents"].is_null());
  EXPECT_EQ(p.context["add_generation_prompt"], true);
  EXPECT_TRUE(p.has_tools);
  EXPECT_EQ(p.tool_choice, ToolChoice::kAuto);
  EXPECT_FALSE(p.parallel_tool_calls);
  // Without tools the template gets tools = null (as transformers passes tools=None); [] too.
  EXPECT_TRUE(read_ok(R"({"messages": [{"role": "user", "content": "x"}]})").context["tools"].is_null());
  const ChatRequestParts none = read_ok(R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "none"})");
  EXPECT_TRUE(none.context["tools"].is_null());
  EXPECT_FALSE(none.has_tools);
  EXPECT_EQ(none.tool_choice, ToolChoice::kNone);
  // Forcing a call: "required" and a named function of the tools are read (the grammar that
  // forces them is openai_request.cc's, as is the one that holds strict tools' calls to their schemas).
  const std::string f = R"("tools": [{"type": "function", "function": {"name": "f", "strict": true}}])";
  const ChatRequestParts req = read_ok(R"({"messages": [{"role": "user", "content": "x"}], )" + f + R"(, "tool_choice": "required"})");
  EXPECT_EQ(req.tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(req.strict_tool, 0);
  const ChatRequestParts named = read_ok(R"({"messages": [{"role": "user", "content": "x"}], )" + f +
                                         R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})");
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_name, "f");
  // A null field is absent (clients echo an answer's message back with "refusal": null).
  EXPECT_EQ(read_ok(R"({"messages": [{"role": "assistant", "content": "a", "refusal": null}]})").context["messages"][0].dump(),
            R"({"role":"assistant","content":"a"})");
  // A reasoning model's earlier thoughts, under each name templates read, reach the template.
  EXPECT_EQ(read_ok(R"({"messages": [{"role": "assistant", "content": "4", "reasoning_content": "2+2", "reasoning": "r",
                                      "thinking": "t"}]})")
                .context["messages"][0]
                .dump(),
            R"({"role":"assistant","content":"4","reasoning_content":"2+2","reasoning":"r","thinking":"t"})");
  // An assistant message without content keeps it absent (undefined in the template).
  EXPECT_FALSE(read_ok(R"({"messages": [{"role": "assistant"}]})").context["messages"][0].contains("content"));
}

TEST(ChatRequest, EveryWrongFieldIsA400NamingIt) {
  const std::string user = R"({"role": "user", "content": "x"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]})", "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]}]})",
       "messages[0].content[0].extra"},
      {R"({"messages": [{"role": "user", "content": "x", "weight": 1}]})", "messages[0].weight"},
      {R"({"messages": [{"role": "user", "content": "x", "name": 5}]})", "messages[0].name"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]})",
       "messages[0].tool_calls[0].id"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "code", "function": {"name": "f"}}]}]})",
       "messages[0].tool_calls[0].type"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{nope"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "tool", "content": "r"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_call_id": "1"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "function", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": "x", "reasoning_content": "t"}]})", "messages[0].reasoning_content"},
      {R"({"messages": [{"role": "assistant", "content": "x", "thinking": ["t"]}]})", "messages[0].thinking"},
      {"{\"messages\": [" + user + "], \"tools\": {}}", "tools"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\"}]}", "tools[0].function"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"retrieval\", \"function\": {\"name\": \"f\"}}]}", "tools[0].type"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"\"}}]}",
       "tools[0].function.name"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 1}}]}",
       "tools[0].function.parameters"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": 1}}]}",
       "tools[0].function.strict"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
       "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
       "tools[1].function.name"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"color\": 1}}]}",
       "tools[0].function.color"},
      {"{\"messages\": [" + user + "], \"tool_choice\": \"required\"}", "tool_choice"},
      {"{\"messages\": [" + user + "], \"tool_choice\": \"sometimes\"}", "tool_choice"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
       "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}",
       "tool_choice"},
      {"{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
       "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\", \"x\": 1}}}",
       "tool_choice.function.x"},
      {"{\"messages\": [" + user + "], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}}",
       "tool_choice"},
      {"{\"messages\": [" + user + "], \"parallel_tool_calls\": \"yes\"}", "parallel_tool_calls"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = read_error(body);
    EXPECT_EQ(e.param, param) << body << " -> " << e.message;
    EXPECT_NE(e.message.find(param), std::string::npos) << e.message;
  }
  // The refusals say why: an image part names its type; forcing a call needs tools, and names one of them.
  EXPECT_NE(read_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})").message.find("image_url"),
            std::string::npos);
  EXPECT_NE(read_error("{\"messages\": [" + user + "], \"tool_choice\": \"required\"}").message.find("'tools'"),
            std::string::npos);
  EXPECT_NE(read_error("{\"messages\": [" + user + "], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                       "\"f\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}")
                .message.find("'g', which is not one of 'tools'"),
            std::string::npos);
}

TEST(ChatRequest, DeeplyNestedBodiesAreRefusedBeforeTheyAreCopied) {
  ApiContext ctx;
  ctx.model_name = "m";
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  ApiRequest req;
  ApiError error;
  const std::string body = R"({"messages": [{"role": "user", "content": "x"}], "tools": )" + deep + "}";
  EXPECT_FALSE(parse_api_request(ApiEndpoint::kChatCompletions, body, ctx, &req, &error));
  EXPECT_EQ(error.http_status, 400);
  EXPECT_NE(error.message.find("deeper than"), std::string::npos) << error.message;
  // Model output nested that deep is content, not a call.
  auto parser = make_tool_call_parser(ToolCallFormat::kHermes);
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + deep + "}}</tool_call>";
  EXPECT_TRUE(parse_tool_calls(*parser, text, true).calls.empty());
}

}  // namespace
}  // namespace tessera
