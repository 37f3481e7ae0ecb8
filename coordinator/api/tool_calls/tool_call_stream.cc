#include "coordinator/api/tool_calls/tool_call_stream.h"

#include <chrono>
#include <random>

namespace tessera {
namespace {

bool all_whitespace(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return false;
  return true;
}

}  // namespace

std::string make_tool_call_id(bool short_id) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = short_id ? "" : "call_";
  for (int i = 0; i < (short_id ? 9 : 24); ++i) id += short_id ? kAlnum[rng() % 62] : kHex[rng() % 16];
  return id;
}

void ToolCallStream::add_content(std::string_view text, std::vector<ToolCallDelta>* out) {
  if (text.empty()) return;
  // Whitespace waits for text after it: an output of calls and whitespace has no content.
  if (!content_sent_ && all_whitespace(text)) {
    held_ws_ += text;
    return;
  }
  if (!out->empty() && !out->back().is_call) {
    out->back().content += held_ws_;
    out->back().content += text;
  } else {
    ToolCallDelta d;
    d.content = held_ws_ + std::string(text);
    out->push_back(std::move(d));
  }
  held_ws_.clear();
  content_sent_ = true;
}

std::vector<ToolCallDelta> ToolCallStream::decide(bool final) {
  std::vector<ToolCallDelta> out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const std::string_view rest = std::string_view(pending_).substr(pos);
    ToolCallSegment seg = parser_->next(rest, at_start_, final);
    if (seg.kind == ToolCallSegment::Kind::kUndecided || seg.length == 0) {
      if (!final) break;
      seg.kind = ToolCallSegment::Kind::kText;  // a parser's contract says never; stay safe
      seg.length = rest.size();
    }
    seg.length = std::min(seg.length, rest.size());
    const bool take_calls = seg.kind == ToolCallSegment::Kind::kCalls &&
                            (parallel_ || (calls_ == 0 && seg.calls.size() == 1));
    if (take_calls) {
      for (ParsedToolCall& c : seg.calls) {
        ToolCallDelta d;
        d.is_call = true;
        d.index = calls_++;
        d.id = make_tool_call_id(parser_->short_call_ids());
        d.call = std::move(c);
        out.push_back(std::move(d));
      }
    } else {
      add_content(rest.substr(0, seg.length), &out);
    }
    pos += seg.length;
    at_start_ = false;
  }
  pending_.erase(0, pos);
  return out;
}

std::vector<ToolCallDelta> ToolCallStream::feed(std::string_view text) {
  pending_ += text;
  return decide(false);
}

std::vector<ToolCallDelta> ToolCallStream::finish() {
  std::vector<ToolCallDelta> out = decide(true);
  // Whitespace never followed by text: content when there are no calls (the output as it
  // is), dropped when there are.
  if (!held_ws_.empty() && calls_ == 0) {
    ToolCallDelta d;
    d.content = std::move(held_ws_);
    out.push_back(std::move(d));
    content_sent_ = true;
  }
  held_ws_.clear();
  return out;
}

ParsedToolCalls parse_tool_calls(const ToolCallParser& parser, std::string_view text, bool parallel_calls) {
  ToolCallStream stream(&parser, parallel_calls);
  std::vector<ToolCallDelta> deltas = stream.feed(text);
  for (ToolCallDelta& d : stream.finish()) deltas.push_back(std::move(d));
  ParsedToolCalls out;
  std::string content;
  for (ToolCallDelta& d : deltas) {
    if (d.is_call) {
      out.calls.push_back(std::move(d));
    } else {
      content += d.content;
    }
  }
  if (stream.has_content() || out.calls.empty()) out.content = std::move(content);
  return out;
}

}  // namespace tessera
