#pragma once
// Finds stop strings in streamed text that arrives in arbitrary pieces (detokenized deltas),
// so a stop string split across tokens is still found and never emitted. Text that could be
// the beginning of a stop string is held back until the next piece decides it.
//
// vLLM's min_tokens: text pushed with may_stop = false (before min_tokens tokens) cannot end
// the output by itself; a stop string counts once it ends in text pushed with may_stop = true
// (it may begin earlier). include_stop_str_in_output keeps the matched stop string in the text.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class StopStringMatcher {
 public:
  // Empty strings are ignored (they would match everywhere).
  explicit StopStringMatcher(std::vector<std::string> stop_strings = {}, bool include_stop_string = false);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed; `text` is everything before it (and it, when included)
  };

  // Adds a piece of text. After a stop, further pushes return nothing.
  Result push(std::string_view piece, bool may_stop = true);
  // No more text follows: releases what was held back (it cannot complete a stop string now).
  std::string finish();

  bool stopped() const { return stopped_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // not yet emitted; holds a whole stop string only in its first guard_ bytes
  size_t guard_ = 0;  // leading bytes of held_ pushed with may_stop = false: no match ends in them
  bool include_stop_ = false;
  bool stopped_ = false;
};

}  // namespace tessera
