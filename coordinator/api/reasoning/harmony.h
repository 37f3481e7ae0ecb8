#pragma once
// gpt-oss writes in OpenAI's harmony format: its output is a run of messages, each a header
// (<|start|>assistant, <|channel|>NAME, an optional " to=RECIPIENT", an optional
// "<|constrain|>json") then <|message|> and a body ended by <|end|>, <|return|> or <|call|>
// (all special tokens, kept in the text for this reader). The channels say what a body is:
//   analysis                          thoughts (reasoning_content)
//   final                             the answer (content)
//   commentary, no recipient          a preamble shown to the user (content)
//   any channel to=functions.NAME     a tool call: written to the content as
//                                     <|channel|>commentary to=functions.NAME<|message|>ARGS<|call|>
//                                     for the "openai" tool-call parser (tool_calls/harmony.cc)
// The prompt ends with "<|start|>assistant", so the first header usually starts at
// <|channel|>. Text that does not start a header (a model answering plainly) is content.
#include <string>
#include <string_view>

#include "coordinator/api/reasoning/reasoning_parser.h"

namespace tessera {

// The text the reader writes for a call; the "openai" tool-call parser reads it back.
inline constexpr std::string_view kHarmonyCallOpen = "<|channel|>commentary to=";
inline constexpr std::string_view kHarmonyMessage = "<|message|>";
inline constexpr std::string_view kHarmonyCall = "<|call|>";

// Splits harmony output given in pieces; the same split however the text is cut (text that
// may be the start of a marker is held back until the next piece or the end decides it).
class HarmonyReader {
 public:
  ReasoningDelta feed(std::string_view text, bool final);
  bool in_reasoning() const { return state_ == State::kBody && kind_ == Body::kThoughts; }
  bool had_reasoning() const { return had_reasoning_; }

 private:
  enum class State : uint8_t { kHeader, kBody };
  enum class Body : uint8_t { kThoughts, kAnswer, kCall };
  // A whole header (its <|message|> excluded) read: the body it opens.
  void start_body(std::string_view header, ReasoningDelta& out);

  State state_ = State::kHeader;
  Body kind_ = Body::kAnswer;
  std::string pending_;
  bool had_reasoning_ = false;
};

}  // namespace tessera
