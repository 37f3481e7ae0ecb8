#pragma once
// The OpenAI-compatible request/response layer, without any transport: request JSON ->
// Requests (every invalid field named in the error), and the JSON of responses, stream
// chunks and errors. Submitting them (the n-choice fan-out) is
// coordinator/api/api_submission.h. The HTTP server (coordinator/server/http_server.cc) only
// moves bytes; everything a client can get wrong is decided here, so it is cheap to test and
// fuzz.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/api_error.h"
#include "coordinator/api/chat_template.h"
#include "coordinator/api/embedding_pooling.h"
#include "coordinator/api/reasoning/reasoning_parser.h"
#include "coordinator/api/served_loras.h"
#include "coordinator/api/tool_calls/tool_call_format.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/engine/structured/token_vocabulary.h"

namespace tessera {

enum class ApiEndpoint { kCompletions, kChatCompletions, kEmbeddings };

// Renders a chat template's context — "messages", "tools", "documents",
// "add_generation_prompt" (coordinator/api/chat_request.h builds it) — into the prompt text,
// e.g. with ChatTemplate::render. The rendered text is tokenized without adding special
// tokens (the template brings its own). InvalidArgument (raise_exception in the template)
// is the client's 400; any other error is the server's 500.
using ChatRenderer = std::function<StatusOr<std::string>(const nlohmann::ordered_json& context)>;

class ToolCallStream;
class ReasoningStream;

// What the API layer needs to know about the served model.
struct ApiContext {
  const Tokenizer* tokenizer = nullptr;  // null: only token-id prompts are accepted
  std::string model_name;
  // LoRA adapters served beside the model (lora.adapters, and those loaded at run time): name
  // -> PEFT folder, shared by the front ends. A request's "model" naming one runs with it.
  std::shared_ptr<ServedLoras> lora_adapters = std::make_shared<ServedLoras>();
  ServedModels served() const { return {model_name, lora_adapters->snapshot()}; }
  int max_model_len = 4096;
  // What max_model_len is when it is not the model's context (the whole KV pool, the token
  // budget): added to the context-length message so the client knows which limit it hit.
  std::string max_model_len_limit;
  ChatRenderer chat_renderer;  // empty: chat completions are refused (500: no chat template)
  // How tool calls are read out of generated text (requests with tools); null = not read:
  // the text stays the content.
  std::shared_ptr<const ToolCallParser> tool_call_parser;
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;  // the parser's format
  // The tokenizer's tokens as byte strings, for structured output (response_format, guided_*);
  // make_api_context builds it when there is a tokenizer. Null: such requests are refused.
  std::shared_ptr<const structured::TokenVocabulary> token_vocabulary;
  // What a forced tool call (tool_choice "required" / named) is matched over: token_vocabulary,
  // with the call marker's special token given its text when the format has one (Mistral's
  // [TOOL_CALLS], TokenVocabulary::with_token_bytes). make_api_context builds it.
  std::shared_ptr<const structured::TokenVocabulary> tool_call_vocabulary;
  // Whether this front end returns tool_calls (the ZeroMQ API does not: it refuses requests
  // whose tool calls would be read).
  bool tool_calls_out = true;
  // How a chat answer's thoughts are told apart (reasoning_content); kNone: they stay content.
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // server.task: whether completions and chat are answered, and (set) how embeddings are
  // pooled — unset: /v1/embeddings is refused.
  bool generation = true;
  std::optional<EmbeddingPooling> embeddings;
};

// The context a front end (HTTP, ZeroMQ) serves with: `renderer` when given, else the
// tokenizer's chat template (ChatTemplate::for_tokenizer: its own, or the built-in llama2
// when it has none; one that does not parse answers chat requests with a 500 naming the
// error — tessera-serve refuses it at start-up). `tool_calls`: the tool-call format;
// nullopt = auto, decided from the template's text when make_api_context loads it, none
// with a given `renderer`. `reasoning` likewise.
ApiContext make_api_context(const Tokenizer* tokenizer, std::string model_name, int max_model_len,
                            ChatRenderer renderer, std::optional<ToolCallFormat> tool_calls = std::nullopt,
                            std::optional<ReasoningFormat> reasoning = std::nullopt);

// A decoded request: one engine Request per prompt, each with best_of (= n unless asked)
// choices; a response's choice index is prompt_index × n + choice.
struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;  // as served (the request's "model" when given, it must match)
  std::string lora;   // the LoRA adapter "model" named ("" = the base); every Request carries it
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
  // Chat with tools (and tool_choice not "none"): how tool calls are read out of the text;
  // null = the text is the content.
  std::shared_ptr<const ToolCallParser> tool_call_parser;
  bool parallel_tool_calls = true;  // false: at most one call is read
  // Chat on a reasoning model (ApiContext::reasoning): its thoughts go to reasoning_content
  // (dropped with include_reasoning false), the rest is the answer; the output starts inside
  // the thoughts when the rendered prompt left a <think> open.
  bool reasoning = false;
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;  // how (set when reasoning)
  bool starts_in_reasoning = false;
  bool include_reasoning = true;
  // Embeddings: the vectors as base64 of little-endian float32 (encoding_format "base64"),
  // cut to the first `dimensions` values (0 = all) before normalisation.
  bool embedding_base64 = false;
  int dimensions = 0;
  bool normalize_embedding = true;

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

// /v1/embeddings (coordinator/api/embeddings_request.cc): "input" (a string, strings, token ids
// or arrays of them), encoding_format, dimensions, user, truncate_prompt_tokens; one engine
// Request per input, pooled as context.embeddings says. Called by parse_api_request.
bool parse_embeddings_request(std::string_view body, const ApiContext& context, ApiRequest* out, ApiError* error);
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
  // Streaming with tool calls read: the choice's parser state, and the tokens whose text is
  // held back (their logprobs go with the next chunk that is sent).
  std::shared_ptr<ToolCallStream> tool_stream;
  std::vector<SampledToken> stream_held_tokens;
  // Streaming a reasoning model's chat (ApiRequest::reasoning): where its thoughts end.
  std::shared_ptr<ReasoningStream> reasoning_stream;
  std::vector<float> embedding;  // an embedding request's vector, as pooled (not normalised)
};

// A submitted request's choices as their engine events arrive (by generated index, as
// submit_api_request reports them): what each has gathered (text, tokens, prompt logprobs,
// counts, the embedding, its finish reason), which have finished, and the first engine error.
struct ChoiceResults {
  explicit ChoiceResults(size_t choices = 0)
      : outputs(choices), done(choices, 0), remaining(static_cast<int>(choices)) {}
  // Adds one event of choice `index`; false (nothing changed) when that choice has finished.
  bool add(size_t index, const GenerateEvent& event);
  bool complete() const { return remaining == 0; }

  std::vector<ChoiceOutput> outputs;
  std::vector<char> done;
  int remaining = 0;         // choices not finished
  std::string error;         // the first engine error ("" none)
  bool unavailable = false;  // that error: the workers could not run it (503, not 500)
  bool cut = false;          // a choice was aborted by the server (a drain's deadline, a cancelled batch)
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// Usage of a whole request: each prompt counted once, every choice's completion tokens.
Usage usage_of(const ApiRequest& request, const std::vector<ChoiceOutput>& choices);

// An embedding as the client gets it: the pooled vector cut to its first `dimensions` values
// (0: all), then scaled to unit L2 norm when `normalize` (a zero vector stays zero).
std::vector<float> finish_embedding(const std::vector<float>& pooled, int dimensions, bool normalize);
// The /v1/embeddings response: {"object": "list", "data": [{"object": "embedding", "index",
// "embedding"}], "model", "usage"}, each vector cut to `dimensions` and normalised as asked.
std::string embeddings_response_body(const ApiRequest& request, const std::string& id, int64_t created,
                                     const std::vector<ChoiceOutput>& choices);

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
// The stream events (JSON, without "data: ") for one engine event of choice `index`, whose
// state is *out: none when the event brings nothing to send; else stream_chunk_body's chunk
// — or, when the request's tool calls are read (ApiRequest::tool_call_parser), the content
// and tool-call deltas decided so far (text that may start a call waits until it is
// decided; a call's first delta carries index, id, type and name with arguments "", the
// next its arguments), and with the last event the final chunk, finish_reason
// "tool_calls" when calls were made.
std::vector<std::string> stream_event_chunks(const ApiRequest& request, const std::string& id, int64_t created,
                                             int index, const GenerateEvent& event, const Tokenizer* tokenizer,
                                             ChoiceOutput* out);
// Completions with echo: the chunk that repeats choice `index`'s prompt, with (logprobs >= 0)
// the prompt tokens' logprobs; sets *text_offset to where the generated tokens' offsets start.
std::string stream_echo_body(const ApiRequest& request, const std::string& id, int64_t created, int index,
                             const std::vector<PromptLogprob>& prompt_logprobs, const Tokenizer* tokenizer,
                             size_t* text_offset);
// The final usage chunk (stream_options.include_usage): "choices": [] and "usage".
std::string stream_usage_body(const ApiRequest& request, const std::string& id, int64_t created,
                              const Usage& usage);

// GET /v1/models.
// GET /v1/models: the model, then each LoRA adapter (parent: the model; root: its folder), as
// vLLM lists them.
std::string models_body(const ApiContext& ctx, int64_t created);
// One entry of it: the model's (adapter empty) or an adapter's.
nlohmann::json model_card(const std::string& model_name, int max_model_len, int64_t created,
                          const std::string& adapter = "", const std::string& adapter_path = "");

// "data: <json>\n\n" and "data: [DONE]\n\n".
std::string sse_event(const std::string& json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace tessera
