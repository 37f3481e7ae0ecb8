#pragma once
// Sets of Unicode code points (regex and GBNF character classes) and their translation to
// the byte-level grammar: each code point as its UTF-8 bytes, either raw (a regex over the
// output text) or as it must appear inside a JSON string (a schema's "pattern": '"', '\'
// and control characters become their JSON escapes).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/engine/structured/grammar.h"

namespace tessera::structured {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

class CodepointSet {
 public:
  CodepointSet() = default;
  static CodepointSet of(uint32_t lo, uint32_t hi) {
    CodepointSet s;
    s.add(lo, hi);
    return s;
  }
  void add(uint32_t lo, uint32_t hi);  // inclusive; hi clamped to kMaxCodepoint
  void add(const CodepointSet& other);
  CodepointSet complement() const;  // within [0, kMaxCodepoint], surrogates excluded
  CodepointSet minus(const CodepointSet& other) const;
  bool empty() const { return ranges_.empty(); }
  // Sorted, disjoint, non-adjacent inclusive ranges.
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  void normalize();
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// One code point of `set` as UTF-8 (surrogates never match).
GrammarBuilder::Node utf8_class(GrammarBuilder& g, const CodepointSet& set);
// One code point of `set` as it is written inside a JSON string: raw UTF-8, except '"' as
// \", '\' as \\ and U+0000..U+001F as \u00XX.
GrammarBuilder::Node json_string_class(GrammarBuilder& g, const CodepointSet& set);
// `text` (UTF-8) inside a JSON string, escaped as json_string_class does.
std::string json_escape(const std::string& text);
void append_utf8(std::string& out, uint32_t cp);

}  // namespace tessera::structured
