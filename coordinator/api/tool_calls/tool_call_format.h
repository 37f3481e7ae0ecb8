#pragma once
// Reading tool calls out of a model's generated text. Each model family writes its calls its
// own way; one small parser per format (hermes.cc, llama3_json.cc, mistral.cc) answers one
// question: what is the text at the start of what is still undecided — plain text (how much
// of it), a complete call block (parsed), or not decidable yet. ToolCallStream
// (tool_call_stream.h) drives that for whole outputs and for streams alike, so both give
// the same result however the text is split.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tessera {

// JSON's whitespace (RFC 8259): what the parsers skip around and between call blocks.
inline bool is_json_whitespace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

enum class ToolCallFormat {
  kNone,        // no parsing: the text is the content
  kHermes,      // Hermes / Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  kLlama3Json,  // Llama 3.1/3.2: the whole output is {"name": ..., "parameters": {...}} (";"-separated), optionally after <|python_tag|>
  kMistral,     // Mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
  kHarmony,     // gpt-oss ("openai"): harmony messages to=functions.NAME, as the harmony reader writes them
};

// "none", "hermes", "llama3_json", "mistral", "openai" -> the format; "auto" -> nullopt (decided from
// the chat template, tool_call_format_for_template). Anything else: InvalidArgument.
StatusOr<std::optional<ToolCallFormat>> tool_call_format_from_name(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);

// server.tool_call_parser: auto, from the chat template's text: it mentions "<tool_call>"
// -> hermes; "[TOOL_CALLS]" -> mistral; "<|start_header_id|>" and "\"parameters\"" (Llama
// 3.1/3.2's call instructions) -> llama3_json; "<|channel|>" (harmony) -> openai; else none.
ToolCallFormat tool_call_format_for_template(std::string_view template_source);

// One call as the model wrote it: the function's name and its arguments as compact JSON text.
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text, e.g. {"location":"Paris"}
};

// What the text at the start of an undecided rest is.
struct ToolCallSegment {
  enum class Kind {
    kText,       // `length` bytes of plain text (content)
    kCalls,      // `length` bytes form one block of `calls`
    kUndecided,  // more text is needed to decide (never when the text is final)
  };
  Kind kind = Kind::kUndecided;
  size_t length = 0;
  std::vector<ParsedToolCall> calls;
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  // `rest`: the output's text not yet decided; `at_start`: it starts at the output's first
  // byte; `final`: no more text follows. A result that is not kUndecided must stay the same
  // whatever text is appended later (so streaming and whole outputs agree); kText and kCalls
  // cover at least one byte. Malformed call text is kText: it stays content.
  virtual ToolCallSegment next(std::string_view rest, bool at_start, bool final) const = 0;
  // Whether call ids must be 9 alphanumerics (Mistral's templates refuse others).
  virtual bool short_call_ids() const { return false; }
  // Whether the call marker is a special token (Mistral's [TOOL_CALLS]): a request that reads
  // calls then keeps special tokens in its text unless it sets skip_special_tokens (vLLM).
  virtual bool marker_is_special_token() const { return false; }
  // That marker's text ("[TOOL_CALLS]"); empty when the format has no special-token marker.
  // A forced call's grammar asks for it, so the matcher's vocabulary gives the special token
  // these bytes (ApiContext::tool_call_vocabulary).
  virtual std::string_view special_marker() const { return {}; }
};

// The parser of a format; null for kNone.
std::unique_ptr<const ToolCallParser> make_tool_call_parser(ToolCallFormat format);
std::unique_ptr<const ToolCallParser> make_hermes_parser();
std::unique_ptr<const ToolCallParser> make_llama3_json_parser();
std::unique_ptr<const ToolCallParser> make_mistral_parser();
std::unique_ptr<const ToolCallParser> make_harmony_parser();

// Shared by the parsers (json_text.cc).
// The end (one past) of the JSON value that starts at text[pos] ('{' or '['), found by
// matching brackets outside strings; nullopt when the text ends first.
std::optional<size_t> json_value_end(std::string_view text, size_t pos);
// The deepest nesting of [ and { in JSON text (outside strings). nlohmann::json copies,
// converts and dumps values recursively, so text nested deeper than kMaxJsonDepth is refused
// before it is parsed (request bodies, model output read for calls).
size_t json_nesting_depth(std::string_view text);
inline constexpr size_t kMaxJsonDepth = 128;
// {"name": string, "arguments" (or `alt_arguments`, e.g. "parameters"): object} -> the call;
// nullopt for anything else. Absent arguments are {}.
std::optional<ParsedToolCall> call_from_json_text(std::string_view text, const char* alt_arguments = nullptr);
std::optional<ParsedToolCall> call_from_json(const nlohmann::ordered_json& value, const char* alt_arguments = nullptr);
// The number of bytes at the end of `text` that are a proper prefix of `marker` (text that
// might be the start of the marker, held back until it is decided).
size_t partial_marker_suffix(std::string_view text, std::string_view marker);

}  // namespace tessera
