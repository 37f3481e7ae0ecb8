#pragma once
// A compiled Unicode regular expression (PCRE2, UTF + UCP mode, JIT when available): the
// one regex engine of Tessera (tokenizers and configuration alike), with the match iteration Hugging Face tokenizers gets from Oniguruma: leftmost,
// non-overlapping matches, an empty match right after the previous match skipped.
// Patterns written for Oniguruma (tokenizer.json) are translated where the syntax
// differs: nested character classes such as BLOOM's `[^(\s|[.,!?])]` are flattened.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera::tok {

class Regex {
 public:
  // `pattern` is Oniguruma/Rust syntax from tokenizer.json; `literal` escapes it.
  static StatusOr<std::shared_ptr<const Regex>> compile(const std::string& pattern, bool literal = false);
  // `pattern` in PCRE2's own syntax, untranslated: the regexes users write (the auto-TP rules
  // of docs/configuration.md). InvalidArgument with PCRE2's message and offset when it does
  // not compile (an invalid UTF-8 pattern included).
  static StatusOr<std::shared_ptr<const Regex>> compile_pcre2(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All matches in `text` (which must be valid UTF-8) as [start, end) byte offsets.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  // Whether the pattern matches anywhere in `text` (an unanchored search); false when `text`
  // is not valid UTF-8.
  bool search(std::string_view text) const;
  // Replaces every match with `replacement` (taken literally).
  std::string replace_all(std::string_view text, std::string_view replacement) const;
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  static StatusOr<std::shared_ptr<const Regex>> compile_translated(const std::string& pattern,
                                                                   const std::string& translated, uint32_t options);
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*; kept opaque so the header needs no PCRE2
  bool jit_ = false;
};

// Escapes every regex metacharacter of `text`.
std::string regex_escape(std::string_view text);
// Rewrites Oniguruma-only syntax into PCRE2 syntax (exposed for tests).
StatusOr<std::string> translate_oniguruma_pattern(const std::string& pattern);

}  // namespace tessera::tok
