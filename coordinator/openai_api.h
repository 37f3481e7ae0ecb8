#pragma once
// The OpenAI-compatible request/response layer, without any transport: request JSON ->
// Requests (every invalid field named in the error), and the JSON of responses, stream
// chunks and errors. Submitting them (the n-choice fan-out) is coordinator/api_submission.h. The HTTP server (coordinator/http_server.cc) only moves bytes;
// everything a client can get wrong is decided here, so it is cheap to test and fuzz.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/chat_template.h"  // ChatMessage
#include "coordinator/engine_service.h"

namespace tessera {

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} plus the
// HTTP status it travels with.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field ("temperature", "messages[1].content"); "" = null
  std::string code;   // "" = null
};

std::string error_body(const ApiError& error);
ApiError bad_request(std::string param, std::string message);

enum class ApiEndpoint { kCompletions, kChatCompletions };

// Renders chat messages into the prompt text (e.g. the tokenizer's chat template). The
// rendered text is tokenized without adding special tokens (the template brings its own).
using ChatRenderer = std::function<StatusOr<std::string>(const std::vector<ChatMessage>&)>;

// What the API layer needs to know about the served model.
struct ApiContext {
  const Tokenizer* tokenizer = nullptr;  // null: only token-id prompts are accepted
  std::string model_name;
  int max_model_len = 4096;
  // What max_model_len is when it is not the model's context (the whole KV pool, the token
  // budget): added to the context-length message so the client knows which limit it hit.
  std::string max_model_len_limit;
  ChatRenderer chat_renderer;  // empty: the fallback join (see render_chat_fallback)
};

// The context a front end (HTTP, ZeroMQ) serves with: `renderer` when given, else the
// tokenizer's chat template (or, when it has no usable one, the fallback join, with a
// warning in the log).
ApiContext make_api_context(const Tokenizer* tokenizer, std::string model_name, int max_model_len,
                            ChatRenderer renderer);

// The fallback when no chat template renderer is given: the messages' contents joined by
// "\n" (roles dropped); tokenized with special tokens (BOS) added.
std::string render_chat_fallback(const std::vector<ChatMessage>& messages);

// A decoded request: one engine Request per prompt, each with best_of (= n unless asked)
// choices; a response's choice index is prompt_index × n + choice.
struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;  // as served (the request's "model" when given, it must match)
  std::vector<std::shared_ptr<const Request>> requests;  // one per prompt
  std::vector<std::string> prompt_texts;  // for echo (decoded when the prompt was token ids)
  int n = 1;        // choices returned per prompt
  int best_of = 1;  // choices generated per prompt (>= n): the n with the highest cumulative logprob return
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions only
  // Completions: "logprobs": k (-1 = none). Chat: "logprobs": true -> 0 + top_logprobs.
  int logprobs = -1;
  std::string user;

  // Choices generated (requests × best_of): what the transports gather, by generated index
  // prompt_index × best_of + choice. Without best_of > n these are the response's indexes.
  size_t num_choices() const { return requests.size() * static_cast<size_t>(best_of); }
};

// Parses and validates a request body into *out; false with *error filled when invalid:
// 400 naming the field (param; "stream_options.include_usage", "messages[1].content"),
// 400 "context_length_exceeded" for a prompt + max_tokens over max_model_len (both numbers
// in the message), 404 "model_not_found" when "model" is not the served model.
bool parse_api_request(ApiEndpoint endpoint, std::string_view body, const ApiContext& context, ApiRequest* out,
                       ApiError* error);

// OpenAI's "finish_reason" text: "stop", "length", "abort", "error"; "" (JSON null) for kNone.
const char* api_finish_reason(FinishReason reason);

// The result of one choice, gathered for a non-streaming response.
struct ChoiceOutput {
  std::string text;
  std::vector<SampledToken> tokens;
  std::vector<PromptLogprob> prompt_logprobs;  // echo + logprobs: positions 1.. of the prompt
  size_t stream_text_offset = 0;               // streaming: text_offset of the next chunk's first token
  bool stream_echoed = false;                  // streaming echo + logprobs: the prompt's chunk went out
  FinishReason finish_reason = FinishReason::kNone;
  int completion_tokens = 0;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// Usage of a whole request: each prompt counted once, every choice's completion tokens.
Usage usage_of(const ApiRequest& request, const std::vector<ChoiceOutput>& choices);

// "cmpl-<random hex>" / "chatcmpl-<random hex>".
std::string make_response_id(ApiEndpoint endpoint);

// The non-streaming response body.
std::string response_body(const ApiRequest& request, const std::string& id, int64_t created,
                          const std::vector<ChoiceOutput>& choices, const Tokenizer* tokenizer);

// One streaming event's JSON (without the "data: " framing). `text` is the new text of
// choice `index`; `finish_reason` kNone = not finished yet; `role_only` (chat) = the first
// chunk of a choice, delta {"role": "assistant", "content": ""}. `text_offset` (completions
// logprobs): the choice's text_offset so far, moved past this chunk's tokens, so offsets run
// on across chunks as in the non-streaming response (null: this chunk's start from 0).
std::string stream_chunk_body(const ApiRequest& request, const std::string& id, int64_t created, int index,
                              const std::string& text, const std::vector<SampledToken>& tokens,
                              FinishReason finish_reason, bool role_only, const Tokenizer* tokenizer,
                              size_t* text_offset = nullptr);
// Completions with echo: the chunk that repeats choice `index`'s prompt, with (logprobs >= 0)
// the prompt tokens' logprobs; sets *text_offset to where the generated tokens' offsets start.
std::string stream_echo_body(const ApiRequest& request, const std::string& id, int64_t created, int index,
                             const std::vector<PromptLogprob>& prompt_logprobs, const Tokenizer* tokenizer,
                             size_t* text_offset);
// The final usage chunk (stream_options.include_usage): "choices": [] and "usage".
std::string stream_usage_body(const ApiRequest& request, const std::string& id, int64_t created,
                              const Usage& usage);

// GET /v1/models.
std::string models_body(const std::string& model_name, int max_model_len, int64_t created);

// "data: <json>\n\n" and "data: [DONE]\n\n".
std::string sse_event(const std::string& json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace tessera
