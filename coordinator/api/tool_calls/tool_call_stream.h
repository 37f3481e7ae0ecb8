#pragma once
// Drives a ToolCallParser over a model's output, whole or in pieces: content deltas and
// complete calls, in order, the same however the text is split (a stream holds back text
// that might start a call until it is decided). parse_tool_calls is the non-streaming form.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {

struct ToolCallDelta {
  bool is_call = false;
  std::string content;  // !is_call: content text
  int index = 0;        // is_call: the call's index in the choice's tool_calls
  std::string id;       // is_call: "call_<24 hex>" (Mistral: 9 alphanumerics)
  ParsedToolCall call;  // is_call
};

class ToolCallStream {
 public:
  // `parser` must outlive the stream. `parallel_calls` false: only the first call block
  // holding one call is read; later blocks stay content (parallel_tool_calls: false).
  ToolCallStream(const ToolCallParser* parser, bool parallel_calls) : parser_(parser), parallel_(parallel_calls) {}

  // The deltas the text decided so far (possibly none: text held back).
  std::vector<ToolCallDelta> feed(std::string_view text);
  // The end of the output: the rest is decided (malformed or unclosed calls are content).
  std::vector<ToolCallDelta> finish();

  int num_calls() const { return calls_; }
  // Whether any content delta was sent (false with calls: the message's content is null).
  bool has_content() const { return content_sent_; }

 private:
  std::vector<ToolCallDelta> decide(bool final);
  void add_content(std::string_view text, std::vector<ToolCallDelta>* out);

  const ToolCallParser* parser_;
  bool parallel_;
  std::string pending_;   // text not decided yet
  bool at_start_ = true;  // pending_ starts at the output's first byte
  std::string held_ws_;   // content that is only whitespace so far (dropped when calls are all there is)
  bool content_sent_ = false;
  int calls_ = 0;
};

// A whole output: content (nullopt when it had calls and nothing else but whitespace) and calls.
struct ParsedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCallDelta> calls;
};
ParsedToolCalls parse_tool_calls(const ToolCallParser& parser, std::string_view text, bool parallel_calls);

// A fresh call id: "call_" + 24 hex digits, or 9 alphanumerics (`short_id`, Mistral).
std::string make_tool_call_id(bool short_id);

}  // namespace tessera
