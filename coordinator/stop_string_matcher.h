#pragma once
// Finds stop strings in streamed text that arrives in arbitrary pieces (detokenized deltas),
// so a stop string split across tokens is still found and never emitted. Text that could be
// the beginning of a stop string is held back until the next piece decides it.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class StopStringMatcher {
 public:
  // Empty strings are ignored (they would match everywhere).
  explicit StopStringMatcher(std::vector<std::string> stop_strings = {});

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed; `text` is everything before it
  };

  // Adds a piece of text. After a stop, further pushes return nothing.
  Result push(std::string_view piece);
  // No more text follows: releases what was held back (it cannot complete a stop string now).
  std::string finish();

  bool stopped() const { return stopped_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // not yet emitted; never contains a whole stop string
  bool stopped_ = false;
};

}  // namespace tessera
