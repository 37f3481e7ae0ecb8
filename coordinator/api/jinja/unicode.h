#pragma once
// Unicode helpers for the template engine: Python's str works on code points, so slicing,
// len(), upper()/lower()/title() and strip() do too. Strings stay UTF-8; these convert and
// classify. Case mapping covers Latin (Basic, Latin-1, Extended-A/B), Greek and Cyrillic as
// Python's str methods map them; other scripts pass through unchanged.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::jinja {

// Decodes UTF-8; an invalid byte becomes U+FFFD (inputs are JSON strings, so valid already).
std::u32string utf8_decode(std::string_view s);
void utf8_append(std::string& out, char32_t c);
std::string utf8_encode(std::u32string_view s);
size_t utf8_length(std::string_view s);

// Python's str.isspace() set (what strip() and split() with no argument remove).
bool is_python_space(char32_t c);
// Python's re \w for the scripts above: letters, digits, underscore, and any other letter
// outside ASCII and the punctuation/space blocks.
bool is_word_char(char32_t c);
bool is_cased_upper(char32_t c);
bool is_cased_lower(char32_t c);

std::string to_upper(std::string_view s);  // str.upper() ("ß" -> "SS")
std::string to_lower(std::string_view s);  // str.lower()
// Appends the upper/lower form of one code point (one or more code points).
void append_upper(std::u32string& out, char32_t c);
char32_t lower_of(char32_t c);
std::string python_title(std::string_view s);       // str.title()
std::string python_capitalize(std::string_view s);  // str.capitalize()

}  // namespace tessera::jinja
