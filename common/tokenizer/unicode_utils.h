#pragma once
// UTF-8 and Unicode helpers the tokenizer needs: lossy UTF-8 repair with the same
// replacement rule as Rust's String::from_utf8_lossy and Python's errors="replace"
// (one U+FFFD per maximal invalid subpart), GPT-2's byte <-> printable-char table,
// character classes with the meaning Rust's `char` methods give them, and Unicode
// normalization / lowercasing through ICU (no hand-written tables).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid or
// truncated there.
size_t valid_utf8_length_at(std::string_view s, size_t i);
bool is_valid_utf8(std::string_view s);
// Replaces every maximal invalid subpart with U+FFFD (no copy needed when valid).
std::string to_valid_utf8(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
// Byte length of the UTF-8 sequence whose lead byte is `lead` (1 for stray bytes).
inline size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// GPT-2's bytes_to_unicode(): every byte maps to one printable code point, stored
// here already UTF-8 encoded. unicode_to_byte() inverts it (-1 when not in the table).
const std::array<std::string, 256>& byte_level_chars();
int byte_level_byte(char32_t cp);

// Rust char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t cp);
// Rust regex `\w`: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp);

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };
StatusOr<std::string> normalize_unicode(std::string_view s, NormalizationForm form);
// Full Unicode lowercase mapping (Rust str::to_lowercase).
std::string to_lowercase(std::string_view s);

}  // namespace tessera::tok
