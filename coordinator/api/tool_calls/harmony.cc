// gpt-oss's tool calls (vLLM's "openai" parser), read from what the harmony reader
// (coordinator/api/reasoning/harmony.h) writes for a message addressed to a function:
//   <|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris"}<|call|>
// The text around such blocks is the content. A block addressed to anything but a function
// (a built-in tool such as browser.search) or whose body is not a JSON object stays content.
#include <nlohmann/json.hpp>

#include "coordinator/api/reasoning/harmony.h"
#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {
namespace {

constexpr std::string_view kFunctions = "functions.";

// The call in a whole block (open marker to call marker); nullopt when it is not one.
std::optional<ParsedToolCall> call_in_block(std::string_view block) {
  std::string_view inner = block.substr(kHarmonyCallOpen.size(), block.size() - kHarmonyCallOpen.size() - kHarmonyCall.size());
  const size_t message = inner.find(kHarmonyMessage);
  if (message == std::string_view::npos) return std::nullopt;
  const std::string_view recipient = inner.substr(0, message);
  if (!recipient.starts_with(kFunctions) || recipient.size() == kFunctions.size()) return std::nullopt;
  const std::string_view args = inner.substr(message + kHarmonyMessage.size());
  if (json_nesting_depth(args) > kMaxJsonDepth) return std::nullopt;
  const auto value = nlohmann::ordered_json::parse(args.begin(), args.end(), nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return std::nullopt;
  return ParsedToolCall{std::string(recipient.substr(kFunctions.size())), value.dump()};
}

class HarmonyParser : public ToolCallParser {
 public:
  ToolCallSegment next(std::string_view rest, bool /*at_start*/, bool final) const override {
    ToolCallSegment seg;
    const size_t open = rest.find(kHarmonyCallOpen);
    if (open != 0) {
      size_t n = open;
      if (open == std::string_view::npos) n = rest.size() - (final ? 0 : partial_marker_suffix(rest, kHarmonyCallOpen));
      if (n == 0) return seg;
      seg.kind = ToolCallSegment::Kind::kText;
      seg.length = n;
      return seg;
    }
    const size_t end = rest.find(kHarmonyCall, kHarmonyCallOpen.size());
    if (end == std::string_view::npos) {
      if (!final) return seg;
      seg.kind = ToolCallSegment::Kind::kText;  // the reader always closes a block: this is not one
      seg.length = rest.size();
      return seg;
    }
    seg.length = end + kHarmonyCall.size();
    if (auto call = call_in_block(rest.substr(0, seg.length))) {
      seg.kind = ToolCallSegment::Kind::kCalls;
      seg.calls.push_back(std::move(*call));
    } else {
      seg.kind = ToolCallSegment::Kind::kText;
    }
    return seg;
  }
};

}  // namespace

std::unique_ptr<const ToolCallParser> make_harmony_parser() { return std::make_unique<HarmonyParser>(); }

}  // namespace tessera
