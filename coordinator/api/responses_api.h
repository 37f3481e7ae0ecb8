#pragma once
// OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}) on top of chat
// completions: a Responses body is translated into the chat-completions body it means
// (instructions -> a system message, input items -> messages, function tools -> chat tools,
// text.format -> response_format, previous_response_id -> the stored conversation first),
// which parse_api_request reads with every check chat has; the chat answer — its content,
// reasoning_content and tool_calls, as the chat layer splits them — is then written as
// Responses output items (message, reasoning, function_call), and a chat stream's chunks as the
// Responses event sequence. Fields the translation does not honour are 400s naming them.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/api/api_error.h"

namespace tessera {

// Responses kept for previous_response_id and GET /v1/responses/{id} (store: true, the
// default): at most `max_count` (the oldest go first) and none older than `max_age`.
// Thread-safe.
class ResponseStore {
 public:
  ResponseStore(size_t max_count, std::chrono::seconds max_age) : max_count_(max_count), max_age_(max_age) {}

  struct Stored {
    nlohmann::ordered_json response;  // the response object as it was returned
    // The conversation it ended: the chat messages its request ran on (without its
    // instructions, which a later response does not inherit) and its answer as an assistant
    // message (with tool_calls when it called functions).
    nlohmann::ordered_json messages;
  };
  void put(const std::string& id, Stored stored);
  std::optional<Stored> get(const std::string& id);

 private:
  void expire(std::chrono::steady_clock::time_point now);
  struct Entry {
    Stored stored;
    std::chrono::steady_clock::time_point at;
    uint64_t order;
  };
  const size_t max_count_;
  const std::chrono::seconds max_age_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
  uint64_t next_order_ = 0;
};

// What a Responses body becomes.
struct ResponsesRequest {
  nlohmann::ordered_json chat_body;  // POST /v1/chat/completions' body
  nlohmann::ordered_json messages;   // its messages without the instructions (for the store)
  bool store = true;
  bool stream = false;
  // Echoed into the response object: instructions, max_output_tokens, temperature, top_p,
  // tools, tool_choice, parallel_tool_calls, previous_response_id, text, metadata, user.
  nlohmann::ordered_json echo;
};

// False with *error a 400 naming the field (404 for an unknown or expired
// previous_response_id, 404 model_not_found for another model).
bool parse_responses_request(std::string_view body, const ServedModels& served, ResponseStore& store,
                             ResponsesRequest* out, ApiError* error);

// "resp_<hex>".
std::string make_responses_id();

// The response object for `chat` (a non-streaming chat completion response of one choice),
// with id and created_at; `echo` as parse_responses_request left it.
nlohmann::ordered_json responses_object(const nlohmann::json& chat, const std::string& id, int64_t created_at,
                                        const ResponsesRequest& request);
// The conversation a stored response ends: request.messages and the answer.
nlohmann::ordered_json conversation_after(const ResponsesRequest& request, const nlohmann::json& chat);

// A Responses stream, fed the chat stream's chunks (stream_chunk_body / stream_event_chunks
// JSON) in order: `start` gives response.created and response.in_progress; `feed` turns
// content, reasoning_content and tool_calls deltas into output items
// (response.output_item.added, response.content_part.added, response.output_text.delta,
// response.reasoning_text.delta, response.function_call_arguments.delta, and their .done
// events when an item ends); `finish` closes what is open and ends with response.completed
// (or response.incomplete) carrying `final_response`. Each event is (type, data JSON).
class ResponsesStream {
 public:
  ResponsesStream(std::string id, int64_t created_at, const ResponsesRequest& request);
  using Event = std::pair<std::string, std::string>;
  std::vector<Event> start();
  std::vector<Event> feed(const nlohmann::json& chat_chunk);
  std::vector<Event> finish(const nlohmann::ordered_json& final_response);
  // An error event (the stream then ends).
  Event error(const ApiError& error);

 private:
  enum class Open { kNone, kReasoning, kMessage, kCall };
  void close(std::vector<Event>& out);
  void open(Open kind, std::vector<Event>& out, const nlohmann::json& call = {});
  Event event(const std::string& type, nlohmann::ordered_json data);
  nlohmann::ordered_json shell(const char* status) const;

  std::string id_;
  int64_t created_at_;
  nlohmann::ordered_json echo_;
  uint64_t sequence_ = 0;
  int output_index_ = -1;
  Open open_ = Open::kNone;
  std::string item_id_, text_;
  nlohmann::ordered_json call_;  // the open function_call item
};

// The SSE framing of one Responses event: "event: TYPE\ndata: JSON\n\n".
std::string responses_sse_event(const ResponsesStream::Event& event);

}  // namespace tessera
