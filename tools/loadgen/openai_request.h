#pragma once
// The OpenAI request bodies the load generator sends and what it reads back from each
// streamed chunk. The same body goes over HTTP (with "stream": true and
// stream_options.include_usage) and over Tessera's ZeroMQ client API.
#include <optional>
#include <string>
#include <string_view>

#include "tools/loadgen/workload.h"

namespace tessera::loadgen {

struct RequestFormat {
  bool chat = false;        // /v1/chat/completions (text prompts only) instead of /v1/completions
  bool embeddings = false;  // /v1/embeddings: the prompt is the input, nothing is generated
  bool responses = false;   // /v1/responses (text prompts only): "input", "max_output_tokens"; no ignore_eos
  std::string model;        // "model"; empty = absent (the served model)
  bool ignore_eos = true;   // vLLM's extension: generate exactly max_tokens
  bool logprobs = false;    // ask for the sampled token's logprob: one chunk per token event
                            // even where a token adds no text (no tokenizer, partial UTF-8)
  std::optional<double> temperature;
};

// The request body for `spec`; `http_stream` adds "stream" and "stream_options" (not to an
// embeddings body, whose answer is one JSON object).
std::string request_json(const RequestSpec& spec, const RequestFormat& format, bool http_stream);

// What one server-sent event payload carried.
struct StreamChunk {
  bool valid = false;     // a JSON object
  int tokens = 0;         // output tokens it carries: the logprobs' entries when present,
                          // else 1 for a chunk with new text, else 0
  bool finished = false;  // a choice's finish_reason
  std::string finish_reason;
  std::optional<int> prompt_tokens, completion_tokens;  // from "usage"
  std::optional<std::string> error;                     // {"error": {...}} inside the stream
};
StreamChunk parse_stream_chunk(std::string_view payload, bool chat);
// One event of a Responses stream: response.output_text.delta (one token event), and
// response.completed / response.incomplete (finished, with its usage), or an error event.
StreamChunk parse_responses_event(std::string_view payload);

}  // namespace tessera::loadgen
