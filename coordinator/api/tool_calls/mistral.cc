// Mistral tool calls (v0.3, Nemo): a marker, then a JSON array of calls,
//   [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]
// (a single object is read too). Text before and after is content; a marker not followed by
// a call array stays content. [TOOL_CALLS] is a special token, so a request that reads calls
// keeps special tokens in the text unless it sets skip_special_tokens (openai_request.cc); the
// EOS that ends the output is not text either way (engine_service.cc).
#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {
namespace {

constexpr std::string_view kMarker = "[TOOL_CALLS]";

class MistralParser : public ToolCallParser {
 public:
  ToolCallSegment next(std::string_view rest, bool /*at_start*/, bool final) const override {
    ToolCallSegment seg;
    const size_t at = rest.find(kMarker);
    if (at != 0) {
      size_t n = at;
      if (at == std::string_view::npos) n = rest.size() - (final ? 0 : partial_marker_suffix(rest, kMarker));
      if (n == 0) return seg;
      seg.kind = ToolCallSegment::Kind::kText;
      seg.length = n;
      return seg;
    }
    size_t j = kMarker.size();
    while (j < rest.size() && (rest[j] == ' ' || rest[j] == '\n' || rest[j] == '\r' || rest[j] == '\t')) ++j;
    if (j == rest.size()) {
      if (!final) return seg;
      seg.kind = ToolCallSegment::Kind::kText;
      seg.length = rest.size();
      return seg;
    }
    seg.kind = ToolCallSegment::Kind::kText;
    if (rest[j] != '[' && rest[j] != '{') {
      seg.length = kMarker.size();  // a bare marker: content
      return seg;
    }
    const std::optional<size_t> end = json_value_end(rest, j);
    if (!end) {
      if (!final) return ToolCallSegment{};
      seg.length = rest.size();
      return seg;
    }
    seg.length = *end;
    if (json_nesting_depth(rest.substr(j, *end - j)) > kMaxJsonDepth) return seg;
    const auto value = nlohmann::ordered_json::parse(rest.begin() + j, rest.begin() + *end, nullptr, false);
    std::vector<ParsedToolCall> calls;
    if (value.is_object()) {
      auto call = call_from_json(value);
      if (!call) return seg;
      calls.push_back(std::move(*call));
    } else if (value.is_array() && !value.empty()) {
      for (const auto& v : value) {
        auto call = call_from_json(v);
        if (!call) return seg;  // one malformed call: the whole block stays content
        calls.push_back(std::move(*call));
      }
    } else {
      return seg;
    }
    seg.kind = ToolCallSegment::Kind::kCalls;
    seg.calls = std::move(calls);
    return seg;
  }
  bool short_call_ids() const override { return true; }
  bool marker_is_special_token() const override { return true; }
  std::string_view special_marker() const override { return kMarker; }
};

}  // namespace

std::unique_ptr<const ToolCallParser> make_mistral_parser() { return std::make_unique<MistralParser>(); }

}  // namespace tessera
