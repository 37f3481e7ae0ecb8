#include "coordinator/api/reasoning/reasoning_parser.h"

#include <algorithm>
#include <cctype>

#include "coordinator/api/reasoning/harmony.h"
#include "coordinator/api/tool_calls/tool_call_format.h"  // partial_marker_suffix

namespace tessera {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool is_think_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

size_t leading_think_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_think_space(s[n])) ++n;
  return n;
}

}  // namespace

StatusOr<std::optional<ReasoningFormat>> reasoning_format_from_setting(std::string_view setting) {
  if (setting == "auto") return std::optional<ReasoningFormat>();
  if (setting == "none") return std::optional<ReasoningFormat>(ReasoningFormat::kNone);
  if (setting == "deepseek_r1" || setting == "qwen3") return std::optional<ReasoningFormat>(ReasoningFormat::kThinkTags);
  if (setting == "gpt_oss") return std::optional<ReasoningFormat>(ReasoningFormat::kHarmony);
  return invalid_argument("server.reasoning_parser: '" + std::string(setting) +
                          "' is not one of auto, deepseek_r1, qwen3, gpt_oss, none");
}

ReasoningFormat reasoning_format_for_template(std::string_view template_source) {
  if (template_source.find("<|channel|>") != std::string_view::npos) return ReasoningFormat::kHarmony;
  // DeepSeek-R1's distills' templates only strip "</think>" from earlier answers.
  const bool mentions = template_source.find(kThinkOpen) != std::string_view::npos ||
                        template_source.find(kThinkClose) != std::string_view::npos;
  return mentions ? ReasoningFormat::kThinkTags : ReasoningFormat::kNone;
}

const char* reasoning_format_name(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kThinkTags: return "think tags (<think> ... </think>)";
    case ReasoningFormat::kHarmony: return "harmony channels (analysis, final)";
    case ReasoningFormat::kNone: break;
  }
  return "none";
}

namespace {

std::string_view without_trailing_space(std::string_view prompt) {
  while (!prompt.empty() && is_think_space(prompt.back())) prompt.remove_suffix(1);
  return prompt;
}

}  // namespace

bool prompt_opens_reasoning(std::string_view prompt) { return without_trailing_space(prompt).ends_with(kThinkOpen); }

bool prompt_closes_reasoning(std::string_view prompt) { return without_trailing_space(prompt).ends_with(kThinkClose); }

// Inside already, the model may still write the opening tag itself (some DeepSeek-R1 versions
// do): kUndecided drops it either way, and goes on into the thoughts or the answer.
ReasoningStream::ReasoningStream(bool starts_in_reasoning, ReasoningFormat format)
    : state_(State::kUndecided),
      starts_in_(starts_in_reasoning && format != ReasoningFormat::kHarmony),
      had_reasoning_(starts_in_),
      harmony_(format == ReasoningFormat::kHarmony ? std::make_unique<HarmonyReader>() : nullptr) {}

ReasoningStream::~ReasoningStream() = default;
ReasoningStream::ReasoningStream(ReasoningStream&&) noexcept = default;

bool ReasoningStream::in_reasoning() const { return harmony_ ? harmony_->in_reasoning() : state_ == State::kReasoning; }

bool ReasoningStream::had_reasoning() const { return harmony_ ? harmony_->had_reasoning() : had_reasoning_; }

ReasoningDelta ReasoningStream::feed(std::string_view text, bool last) {
  if (harmony_) return harmony_->feed(text, last);
  pending_.append(text);
  return decide(last);
}

ReasoningDelta ReasoningStream::decide(bool final) {
  ReasoningDelta out;
  for (;;) {
    switch (state_) {
      case State::kUndecided: {
        const size_t space = leading_think_space(pending_);
        const std::string_view rest = std::string_view(pending_).substr(space);
        if (rest.starts_with(kThinkOpen)) {
          pending_.erase(0, space + kThinkOpen.size());
          state_ = State::kReasoning;
          had_reasoning_ = true;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return out;  // may still open
        state_ = starts_in_ ? State::kReasoning : State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = pending_.find(kThinkClose);
        if (close != std::string::npos) {
          out.reasoning.append(pending_, 0, close);
          pending_.erase(0, close + kThinkClose.size());
          state_ = State::kAfterReasoning;
          continue;
        }
        const size_t held = final ? 0 : partial_marker_suffix(pending_, kThinkClose);
        out.reasoning.append(pending_, 0, pending_.size() - held);
        pending_.erase(0, pending_.size() - held);
        return out;
      }
      case State::kAfterReasoning:
        pending_.erase(0, leading_think_space(pending_));
        if (pending_.empty()) return out;
        state_ = State::kContent;
        continue;
      case State::kContent:
        out.content.append(pending_);
        pending_.clear();
        return out;
    }
  }
}

SplitReasoning split_reasoning(std::string_view text, bool starts_in_reasoning, ReasoningFormat format) {
  ReasoningStream stream(starts_in_reasoning, format);
  ReasoningDelta all = stream.feed(text, /*last=*/true);
  SplitReasoning split;
  if (stream.had_reasoning()) split.reasoning = std::move(all.reasoning);
  if (!stream.in_reasoning()) split.content = std::move(all.content);
  return split;
}

}  // namespace tessera
