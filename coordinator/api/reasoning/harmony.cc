#include "coordinator/api/reasoning/harmony.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "coordinator/api/tool_calls/tool_call_format.h"  // partial_marker_suffix

namespace tessera {
namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
// What ends a body: its terminators, or the next message's header beginning without one.
constexpr std::array<std::string_view, 5> kBodyEnds = {"<|end|>", "<|return|>", "<|call|>", "<|start|>",
                                                       "<|channel|>"};

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// The word after `key` in `header` (up to whitespace or the next '<'); empty when absent.
std::string_view word_after(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = header.substr(at + key.size());
  size_t n = 0;
  while (n < rest.size() && !is_space(rest[n]) && rest[n] != '<') ++n;
  return rest.substr(0, n);
}

// The longest suffix of `text` that may be the start of any of `markers`.
template <size_t N>
size_t held_suffix(std::string_view text, const std::array<std::string_view, N>& markers) {
  size_t held = 0;
  for (std::string_view m : markers) held = std::max(held, partial_marker_suffix(text, m));
  return held;
}

// The first of `markers` in `text`: its position and length (npos when none).
template <size_t N>
std::pair<size_t, size_t> first_of(std::string_view text, const std::array<std::string_view, N>& markers) {
  std::pair<size_t, size_t> best = {std::string_view::npos, 0};
  for (std::string_view m : markers)
    if (const size_t at = text.find(m); at < best.first) best = {at, m.size()};
  return best;
}

}  // namespace

void HarmonyReader::start_body(std::string_view header, ReasoningDelta& out) {
  const std::string_view recipient = word_after(header, "to=");
  const std::string_view channel = word_after(header, kChannel);
  state_ = State::kBody;
  if (!recipient.empty()) {
    kind_ = Body::kCall;
    out.content.append(kHarmonyCallOpen).append(recipient).append(kHarmonyMessage);
  } else if (channel == "analysis") {
    kind_ = Body::kThoughts;
    had_reasoning_ = true;
  } else {
    kind_ = Body::kAnswer;  // final, a commentary preamble, or a channel this reader does not know
  }
}

ReasoningDelta HarmonyReader::feed(std::string_view text, bool final) {
  pending_.append(text);
  ReasoningDelta out;
  for (;;) {
    if (state_ == State::kHeader) {
      size_t space = 0;
      while (space < pending_.size() && is_space(pending_[space])) ++space;
      const std::string_view rest = std::string_view(pending_).substr(space);
      const bool header = rest.starts_with(kStart) || rest.starts_with(kChannel);
      if (!header) {
        const bool may_be = !final && (kStart.starts_with(rest) || kChannel.starts_with(rest));
        if (may_be) return out;
        // Not a header: plain text, read as an answer body.
        state_ = State::kBody;
        kind_ = Body::kAnswer;
        continue;
      }
      const size_t message = pending_.find(kHarmonyMessage);
      if (message == std::string::npos) {
        if (!final) return out;
        pending_.clear();  // the output ended inside a header: nothing to show
        return out;
      }
      const std::string header_text = pending_.substr(0, message);
      pending_.erase(0, message + kHarmonyMessage.size());
      start_body(header_text, out);
      continue;
    }
    std::string& sink = kind_ == Body::kThoughts ? out.reasoning : out.content;
    const auto [end, length] = first_of(pending_, kBodyEnds);
    if (end == std::string::npos) {
      const size_t held = final ? 0 : held_suffix(pending_, kBodyEnds);
      sink.append(pending_, 0, pending_.size() - held);
      pending_.erase(0, pending_.size() - held);
      if (final && kind_ == Body::kCall) out.content.append(kHarmonyCall);  // a call ended by its stop token
      return out;
    }
    sink.append(pending_, 0, end);
    if (kind_ == Body::kCall) out.content.append(kHarmonyCall);
    // A terminator is dropped; a header that starts without one stays for the header reader.
    const std::string_view marker = std::string_view(pending_).substr(end, length);
    pending_.erase(0, end + (marker == kStart || marker == kChannel ? 0 : length));
    state_ = State::kHeader;
  }
}

}  // namespace tessera
