// Hermes / Qwen 2.5 tool calls: each call is a block
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
// anywhere in the output; the text around the blocks is the content. A block whose JSON is
// not a call stays content. An unclosed block at the very end (the model stopped right after
// its JSON) is read as a call when its JSON is one. A block whose JSON value is a call ends
// at the close tag after that value, so an argument string holding "</tool_call>" (which a
// forced call's grammar allows) stays in the call.
#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_json_whitespace(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_json_whitespace(s.back())) s.remove_suffix(1);
  return s;
}

class HermesParser : public ToolCallParser {
 public:
  ToolCallSegment next(std::string_view rest, bool /*at_start*/, bool final) const override {
    ToolCallSegment seg;
    const size_t open = rest.find(kOpen);
    if (open != 0) {
      // Text up to the next block, or (no block yet) all but what may start one.
      size_t n = open;
      if (open == std::string_view::npos) n = rest.size() - (final ? 0 : partial_marker_suffix(rest, kOpen));
      if (n == 0) return seg;  // undecided: all of it may be the start of a block
      seg.kind = ToolCallSegment::Kind::kText;
      seg.length = n;
      return seg;
    }
    // A call's JSON may hold "</tool_call>" inside a string (a forced call's grammar allows
    // it): when the block's JSON is a call followed by the close, the block ends there.
    size_t j = kOpen.size();
    while (j < rest.size() && is_json_whitespace(rest[j])) ++j;
    if (j < rest.size() && rest[j] == '{') {
      const std::optional<size_t> end = json_value_end(rest, j);
      if (!end && !final) return seg;  // the JSON goes on
      if (end) {
        size_t k = *end;
        while (k < rest.size() && is_json_whitespace(rest[k])) ++k;
        const std::string_view after = rest.substr(k);
        if (!final && kClose.starts_with(after) && after.size() < kClose.size()) return seg;
        if (after.starts_with(kClose)) {
          if (auto call = call_from_json_text(rest.substr(j, *end - j))) {
            seg.kind = ToolCallSegment::Kind::kCalls;
            seg.length = k + kClose.size();
            seg.calls.push_back(std::move(*call));
            return seg;
          }
        }
      }
    }
    const size_t close = rest.find(kClose, kOpen.size());
    if (close == std::string_view::npos) {
      if (!final) return seg;
      seg.length = rest.size();
      if (auto call = call_from_json_text(trim(rest.substr(kOpen.size())))) {
        seg.kind = ToolCallSegment::Kind::kCalls;
        seg.calls.push_back(std::move(*call));
      } else {
        seg.kind = ToolCallSegment::Kind::kText;
      }
      return seg;
    }
    seg.length = close + kClose.size();
    if (auto call = call_from_json_text(trim(rest.substr(kOpen.size(), close - kOpen.size())))) {
      seg.kind = ToolCallSegment::Kind::kCalls;
      seg.calls.push_back(std::move(*call));
    } else {
      seg.kind = ToolCallSegment::Kind::kText;  // malformed: stays content
    }
    return seg;
  }
};

}  // namespace

std::unique_ptr<const ToolCallParser> make_hermes_parser() { return std::make_unique<HermesParser>(); }

}  // namespace tessera
