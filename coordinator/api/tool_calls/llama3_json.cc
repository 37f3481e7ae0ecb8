// Llama 3.1 / 3.2 JSON tool calls: the whole output is the call,
//   {"name": "get_weather", "parameters": {"city": "Paris"}}
// ("arguments" is read as well), several separated by ";", optionally after <|python_tag|>
// and before a closing <|eom_id|> / <|eot_id|> (present when special tokens are kept).
// Anything else — text first, or JSON that is not a call — is content. The decision needs
// the whole output, so a stream holds back an output that starts like a call until its end.
#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {
namespace {

constexpr std::string_view kPythonTag = "<|python_tag|>";

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_json_whitespace(s[i])) ++i;
  return i;
}

// The calls of a whole output that is nothing but calls; nullopt otherwise.
std::optional<std::vector<ParsedToolCall>> calls_of(std::string_view text) {
  size_t i = skip_ws(text, 0);
  if (text.substr(i).starts_with(kPythonTag)) i = skip_ws(text, i + kPythonTag.size());
  for (std::string_view end : {"<|eom_id|>", "<|eot_id|>"}) {
    std::string_view t = text;
    while (!t.empty() && is_json_whitespace(t.back())) t.remove_suffix(1);
    if (t.ends_with(end)) text = t.substr(0, t.size() - end.size());
  }
  std::vector<ParsedToolCall> calls;
  while (true) {
    const std::optional<size_t> end = json_value_end(text, i);
    if (!end || text[i] != '{') return std::nullopt;
    auto call = call_from_json_text(text.substr(i, *end - i), "parameters");
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    i = skip_ws(text, *end);
    if (i == text.size()) return calls;
    if (text[i] != ';') return std::nullopt;
    i = skip_ws(text, i + 1);
    if (i == text.size()) return calls;  // a trailing ";"
  }
}

class Llama3JsonParser : public ToolCallParser {
 public:
  ToolCallSegment next(std::string_view rest, bool at_start, bool final) const override {
    ToolCallSegment seg;
    seg.length = rest.size();
    seg.kind = ToolCallSegment::Kind::kText;
    if (!at_start) return seg;
    const size_t i = skip_ws(rest, 0);
    const std::string_view head = rest.substr(i);
    const bool may_be_call = head.empty() || head.front() == '{' || head.starts_with(kPythonTag) ||
                             kPythonTag.starts_with(head);
    if (!may_be_call) return seg;
    if (!final) return ToolCallSegment{};  // undecided until the whole output is known
    if (auto calls = calls_of(rest)) {
      seg.kind = ToolCallSegment::Kind::kCalls;
      seg.calls = std::move(*calls);
    }
    return seg;
  }
};

}  // namespace

std::unique_ptr<const ToolCallParser> make_llama3_json_parser() { return std::make_unique<Llama3JsonParser>(); }

}  // namespace tessera
