// A Responses body's input items as the chat messages a template gets
// (coordinator/api/responses_api.h): a reasoning item's thoughts ride on the assistant turn
// after it, as the chat API takes an earlier reply back; a stored response keeps its thoughts.
#include <gtest/gtest.h>

#include <chrono>

#include "coordinator/api/responses_api.h"

namespace tessera {
namespace {

using ojson = nlohmann::ordered_json;

const ServedModels kServed{"kjv-llama", {}};

ojson messages_of(const std::string& input, ResponseStore& store) {
  ResponsesRequest request;
  ApiError error;
  EXPECT_TRUE(parse_responses_request(R"({"input": )" + input + "}", kServed, store, &request, &error)) << error.message;
  return request.chat_body["messages"];
}

std::string error_param(const std::string& input) {
  ResponseStore store(8, std::chrono::seconds(60));
  ResponsesRequest request;
  ApiError error;
  EXPECT_FALSE(parse_responses_request(R"({"input": )" + input + "}", kServed, store, &request, &error));
  return error.param;
}

TEST(ResponsesInput, ReasoningItemsRideOnTheAssistantTurnAfterThem) {
  ResponseStore store(8, std::chrono::seconds(60));
  const std::string thought = R"({"type": "reasoning", "id": "rs_1", "summary": [],
      "content": [{"type": "reasoning_text", "text": "Look it "}, {"type": "reasoning_text", "text": "up."}]})";
  // Before a call: the call's assistant message carries them; a second call joins it.
  ojson m = messages_of(R"([{"role": "user", "content": "Weather?"}, )" + thought + R"(,
      {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
      {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}])",
                        store);
  ASSERT_EQ(m.size(), 3u) << m;
  EXPECT_EQ(m[1]["reasoning_content"], "Look it up.") << m;
  EXPECT_EQ(m[1]["tool_calls"].size(), 2u) << m;
  EXPECT_FALSE(m[2].contains("reasoning_content")) << m;
  // Before an assistant message: that message carries them.
  m = messages_of(R"([{"role": "user", "content": "Hi"}, )" + thought + R"(, {"role": "assistant", "content": "Hello"}])", store);
  ASSERT_EQ(m.size(), 2u) << m;
  EXPECT_EQ(m[1].dump(), R"({"role":"assistant","content":"Hello","reasoning_content":"Look it up."})");
  // With no assistant turn after them (a reply cut inside its thoughts): a turn of their own.
  m = messages_of(R"([{"role": "user", "content": "Hi"}, )" + thought + R"(, {"role": "user", "content": "Go on"}])", store);
  ASSERT_EQ(m.size(), 3u) << m;
  EXPECT_EQ(m[1].dump(), R"({"role":"assistant","content":"","reasoning_content":"Look it up."})");
  // An item with no reasoning text (summaries only, or encrypted content) has nothing to give.
  m = messages_of(R"([{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}, {"role": "user", "content": "Hi"}])",
                  store);
  ASSERT_EQ(m.size(), 1u) << m;
}

TEST(ResponsesInput, AStoredResponseKeepsItsThoughts) {
  ResponseStore store(8, std::chrono::seconds(60));
  ResponsesRequest request;
  ApiError error;
  ASSERT_TRUE(parse_responses_request(R"({"input": "Hi"})", kServed, store, &request, &error)) << error.message;
  const nlohmann::json chat = {{"choices", {{{"message", {{"role", "assistant"}, {"content", "Hello"}, {"reasoning_content", "greet"}}}}}}};
  ResponseStore::Stored stored;
  stored.messages = conversation_after(request, chat);
  store.put("resp_1", stored);
  const ojson m = messages_of(R"("And you?", "previous_response_id": "resp_1")", store);
  ASSERT_EQ(m.size(), 3u) << m;
  EXPECT_EQ(m[1].dump(), R"({"role":"assistant","content":"Hello","reasoning_content":"greet"})");
}

TEST(ResponsesInput, AReasoningItemOfAnotherShapeIsA400NamingIt) {
  EXPECT_EQ(error_param(R"([{"type": "reasoning", "content": "x"}])"), "input[0].content");
  EXPECT_EQ(error_param(R"([{"type": "reasoning", "content": [{"type": "output_text", "text": "x"}]}])"), "input[0].content[0].type");
  EXPECT_EQ(error_param(R"([{"type": "reasoning", "content": [{"type": "reasoning_text", "text": 1}]}])"), "input[0].content[0].text");
}

}  // namespace
}  // namespace tessera
