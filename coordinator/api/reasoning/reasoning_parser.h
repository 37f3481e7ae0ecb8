#pragma once
// Reasoning models (Qwen3, DeepSeek-R1 and its distills, DeepSeek-V3.1 in thinking mode) think
// in text between <think> and </think> before they answer. The chat API returns the thoughts
// apart, as `reasoning_content`, and the answer as `content` (what every peer returns), so a
// client never shows thoughts as the answer and tool calls are read from the answer alone.
//
// Where the output starts is read from the prompt, not assumed per model family: a prompt that
// ends inside an open <think> (DeepSeek-R1's template adds "<think>\n" to the generation
// prompt; DeepSeek-V3.1's adds "<think>" in thinking mode) has the output start in the
// thoughts; otherwise the output is thoughts only if it opens with <think> (Qwen3), and a
// prompt whose think block is already closed (Qwen3 with enable_thinking false, V3.1 without
// thinking) gets an answer only. The thoughts end at the first </think>; whitespace right
// after it is dropped. An output that ends before </think> is all thoughts: no answer.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

// server.reasoning_parser. kThinkTags is the parser above; deepseek_r1 and qwen3 (vLLM's names)
// both select it. kHarmony (gpt_oss) reads gpt-oss's harmony channels (harmony.h).
enum class ReasoningFormat : uint8_t { kNone, kThinkTags, kHarmony };

// "none" -> kNone; "deepseek_r1", "qwen3" -> kThinkTags; "gpt_oss" -> kHarmony; "auto" ->
// nullopt (decide from the chat template: reasoning_format_for_template); anything else an
// InvalidArgument naming it and the accepted values.
StatusOr<std::optional<ReasoningFormat>> reasoning_format_from_setting(std::string_view setting);
// auto: harmony when the chat template's text mentions "<|channel|>"; think tags when it
// mentions "<think>" or "</think>"; else none.
ReasoningFormat reasoning_format_for_template(std::string_view template_source);
const char* reasoning_format_name(ReasoningFormat format);
// Whether an output after `prompt` starts inside the thoughts (the prompt ends in an open
// <think>, whitespace aside).
bool prompt_opens_reasoning(std::string_view prompt);
// Whether `prompt` ends with its thoughts closed (</think>, whitespace aside): the model was
// told not to think (Qwen3 with enable_thinking false).
bool prompt_closes_reasoning(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class HarmonyReader;

// Splits an output given in pieces; the same split however the text is cut (a piece that may
// be the start of a marker is held back until the next piece or finish() decides it).
// `format` kHarmony reads harmony messages (starts_in_reasoning unused), else think tags.
class ReasoningStream {
 public:
  explicit ReasoningStream(bool starts_in_reasoning, ReasoningFormat format = ReasoningFormat::kThinkTags);
  ~ReasoningStream();
  ReasoningStream(ReasoningStream&&) noexcept;
  // `last`: the output ends with this piece, so nothing is held back (as finish()).
  ReasoningDelta feed(std::string_view text, bool last = false);
  ReasoningDelta finish() { return feed({}, true); }
  // The output so far is inside the thoughts (at the end: it was cut before </think>).
  bool in_reasoning() const;
  // Any thought text was seen.
  bool had_reasoning() const;

 private:
  enum class State : uint8_t { kUndecided, kReasoning, kAfterReasoning, kContent };
  ReasoningDelta decide(bool final);

  State state_;
  bool starts_in_;       // the prompt left the thoughts open
  std::string pending_;  // text not decided yet
  bool had_reasoning_ = false;
  std::unique_ptr<HarmonyReader> harmony_;  // set for kHarmony
};

// A whole output: the thoughts (nullopt when there were none), the answer (nullopt when the
// output ended inside the thoughts), and whether it was cut there.
struct SplitReasoning {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
};
SplitReasoning split_reasoning(std::string_view text, bool starts_in_reasoning,
                               ReasoningFormat format = ReasoningFormat::kThinkTags);

}  // namespace tessera
