#include "coordinator/api/jinja/unicode.h"

namespace tessera::jinja {
namespace {

// A block where upper and lower case alternate: [first, last], the upper form at even
// (upper_even) or odd code points.
struct PairBlock {
  char32_t first, last;
  bool upper_even;
};
constexpr PairBlock kPairBlocks[] = {
    {0x0100, 0x012F, true},  {0x0132, 0x0137, true},  {0x0139, 0x0148, false}, {0x014A, 0x0177, true},
    {0x0179, 0x017E, false}, {0x01CD, 0x01DC, false}, {0x01DE, 0x01EF, true},  {0x01F8, 0x021F, true},
    {0x0222, 0x0233, true},  {0x03D8, 0x03EF, true},  {0x0460, 0x0481, true},  {0x048A, 0x04BF, true},
    {0x04C1, 0x04CE, false}, {0x04D0, 0x052F, true},  {0x1E00, 0x1E95, true},  {0x1EA0, 0x1EFF, true},
};

// A block of upper-case letters whose lower forms lie `offset` above.
struct ShiftBlock {
  char32_t first, last;  // the upper-case range
  char32_t offset;
};
constexpr ShiftBlock kShiftBlocks[] = {
    {'A', 'Z', 0x20},        {0x00C0, 0x00D6, 0x20}, {0x00D8, 0x00DE, 0x20}, {0x0391, 0x03A1, 0x20},
    {0x03A3, 0x03AB, 0x20},  {0x0388, 0x038A, 0x25}, {0x0410, 0x042F, 0x20}, {0x0400, 0x040F, 0x50},
    {0x0531, 0x0556, 0x30},  {0xFF21, 0xFF3A, 0x20},
};

struct Single {
  char32_t upper, lower;
};
constexpr Single kSingles[] = {{0x0386, 0x03AC}, {0x038C, 0x03CC}, {0x038E, 0x03CD}, {0x038F, 0x03CE},
                               {0x0178, 0x00FF}, {0x04C0, 0x04CF}, {0x0181, 0x0253}, {0x0186, 0x0254},
                               {0x018F, 0x0259}, {0x0190, 0x025B}, {0x0193, 0x0260}, {0x0194, 0x0263},
                               {0x0196, 0x0269}, {0x0197, 0x0268}, {0x019C, 0x026F}, {0x019D, 0x0272},
                               {0x01A9, 0x0283}, {0x01B7, 0x0292}};

// Lower-case letters whose upper form is not the reverse of a rule above.
constexpr Single kUpperOnly[] = {{0x039C, 0x00B5}, {0x0053, 0x017F}, {0x0049, 0x0131}, {0x03A3, 0x03C2},
                                 {0x0392, 0x03D0}, {0x0398, 0x03D1}, {0x03A6, 0x03D5}, {0x03A0, 0x03D6}};

}  // namespace

char32_t lower_of(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 0x20 : c;
  for (const ShiftBlock& b : kShiftBlocks)
    if (c >= b.first && c <= b.last) return c + b.offset;
  for (const PairBlock& b : kPairBlocks)
    if (c >= b.first && c <= b.last) return ((c % 2 == 0) == b.upper_even) ? c + 1 : c;
  for (const Single& s : kSingles)
    if (c == s.upper) return s.lower;
  return c;
}

static char32_t upper_of(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 0x20 : c;
  for (const Single& s : kUpperOnly)
    if (c == s.lower) return s.upper;
  for (const ShiftBlock& b : kShiftBlocks)
    if (c >= b.first + b.offset && c <= b.last + b.offset) return c - b.offset;
  for (const PairBlock& b : kPairBlocks)
    if (c >= b.first && c <= b.last) return ((c % 2 == 0) == b.upper_even) ? c : c - 1;
  for (const Single& s : kSingles)
    if (c == s.lower) return s.upper;
  return c;
}

void append_upper(std::u32string& out, char32_t c) {
  if (c == 0x00DF) {  // ß -> SS, as Python's full case mapping does
    out += U"SS";
    return;
  }
  out += upper_of(c);
}

bool is_cased_upper(char32_t c) { return lower_of(c) != c; }
bool is_cased_lower(char32_t c) { return upper_of(c) != c || c == 0x00DF; }
static bool is_cased(char32_t c) { return is_cased_upper(c) || is_cased_lower(c); }

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
      out += 0xFFFD;
      ++i;
      continue;
    }
    char32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      const auto cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xC0) != 0x80) ok = false;
      c = (c << 6) | (cb & 0x3F);
    }
    out += ok ? c : 0xFFFD;
    i += ok ? len : 1;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (is_python_space(c)) return false;
  // Punctuation and symbol blocks (Latin-1 signs, general punctuation, CJK punctuation,
  // full-width forms' punctuation, emoji) are not \w.
  if ((c >= 0xA1 && c <= 0xBF && c != 0xAA && c != 0xB5 && c != 0xBA && c != 0xB2 && c != 0xB3 && c != 0xB9) ||
      c == 0xD7 || c == 0xF7)
    return false;
  if ((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) || (c >= 0xFE30 && c <= 0xFE4F) ||
      (c >= 0xFF00 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) || (c >= 0x1F000 && c <= 0x1FAFF))
    return false;
  return true;
}

std::string to_upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : utf8_decode(s)) append_upper(out, c);
  return utf8_encode(out);
}

std::string to_lower(std::string_view s) {
  const std::u32string in = utf8_decode(s);
  std::u32string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char32_t c = in[i];
    if (c == 0x03A3) {
      // Final sigma: a capital sigma after a cased letter and not before one becomes ς.
      const bool after = i > 0 && is_cased(in[i - 1]);
      const bool before = i + 1 < in.size() && is_cased(in[i + 1]);
      out += (after && !before) ? char32_t{0x03C2} : char32_t{0x03C3};
    } else if (c == 0x0130) {
      out += U"i\u0307";  // İ -> i + combining dot above
    } else {
      out += lower_of(c);
    }
  }
  return utf8_encode(out);
}

std::string python_title(std::string_view s) {
  std::u32string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (prev_cased) {
      out += lower_of(c);
    } else if (c == 0x00DF) {
      out += U"Ss";  // the title case of ß
    } else {
      append_upper(out, c);
    }
    prev_cased = is_cased(c);
  }
  return utf8_encode(out);
}

std::string python_capitalize(std::string_view s) {
  const std::u32string in = utf8_decode(s);
  if (in.empty()) return "";
  std::u32string first;
  if (in[0] == 0x00DF) {
    first = U"Ss";
  } else {
    append_upper(first, in[0]);
  }
  return utf8_encode(first) + to_lower(utf8_encode(std::u32string_view(in).substr(1)));
}

}  // namespace tessera::jinja
