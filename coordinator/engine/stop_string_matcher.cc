#include "coordinator/engine/stop_string_matcher.h"

#include <algorithm>

namespace tessera {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings, bool include_stop_string)
    : include_stop_(include_stop_string) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view piece, bool may_stop) {
  Result r;
  if (stopped_) return r;
  if (stops_.empty()) {
    r.text.assign(piece);
    return r;
  }
  held_.append(piece);
  if (!may_stop) guard_ = held_.size();
  // Everything emitted earlier ended with no partial stop string, so any stop string that
  // occurs now starts inside held_: the earliest occurrence ending after the guard wins.
  size_t first = std::string::npos;
  size_t first_len = 0;
  for (const std::string& s : stops_) {
    if (!may_stop) break;
    size_t at = held_.find(s);
    while (at != std::string::npos && at + s.size() <= guard_) at = held_.find(s, at + 1);
    if (at < first) {
      first = at;
      first_len = s.size();
    }
  }
  if (first != std::string::npos) {
    r.text = held_.substr(0, include_stop_ ? first + first_len : first);
    r.stopped = stopped_ = true;
    held_.clear();
    guard_ = 0;
    return r;
  }
  // Keep the longest tail of held_ that is a proper prefix of some stop string. Such a tail
  // starts with a stop string's first byte, so the cut never splits a UTF-8 character.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - keep);
  const size_t emitted = held_.size() - keep;
  held_.erase(0, emitted);
  guard_ = guard_ > emitted ? guard_ - emitted : 0;
  return r;
}

std::string StopStringMatcher::finish() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace tessera
