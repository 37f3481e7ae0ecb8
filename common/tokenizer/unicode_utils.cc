#include "common/tokenizer/unicode_utils.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

namespace tessera::tok {

namespace {

// What a lead byte allows (Unicode Table 3-7): the sequence length and the range of the
// second byte; the third and fourth bytes are always 80..BF. len 0: not a lead byte.
struct Utf8Lead {
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
};

Utf8Lead utf8_lead(unsigned char b0) {
  Utf8Lead l;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    l.len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    l.len = 3;
    if (b0 == 0xE0) l.lo = 0xA0;
    if (b0 == 0xED) l.hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    l.len = 4;
    if (b0 == 0xF0) l.lo = 0x90;
    if (b0 == 0xF4) l.hi = 0x8F;
  }
  return l;
}

}  // namespace

size_t valid_utf8_length_at(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  if (p[i] < 0x80) return 1;
  const Utf8Lead lead = utf8_lead(p[i]);
  if (lead.len == 0 || i + lead.len > n) return 0;
  if (p[i + 1] < lead.lo || p[i + 1] > lead.hi) return 0;
  for (size_t k = 2; k < lead.len; ++k) {
    if (p[i + k] < 0x80 || p[i + k] > 0xBF) return 0;
  }
  return lead.len;
}

// Number of bytes forming the maximal invalid subpart at s[i] (at least 1): the lead
// byte plus the continuation bytes that were still acceptable before the sequence broke.
static size_t invalid_subpart_length(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const Utf8Lead lead = utf8_lead(p[i]);
  if (lead.len == 0) return 1;
  size_t k = 1;
  for (; k < lead.len && i + k < n; ++k) {
    const unsigned char b = p[i + k];
    const unsigned char l = k == 1 ? lead.lo : 0x80;
    const unsigned char h = k == 1 ? lead.hi : 0xBF;
    if (b < l || b > h) break;
  }
  return k;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = valid_utf8_length_at(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = valid_utf8_length_at(s, i);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append(kReplacementChar);
      i += invalid_subpart_length(s, i);
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char b0 = p[i];
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t len = utf8_sequence_length(b0);
  char32_t cp = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int, 512> bytes;  // code point -> byte; all mapped code points are < 512
  ByteLevelTables() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      append_utf8(chars[b], cp);
      bytes[cp] = b;
    }
  }
};
const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}
}  // namespace

const std::array<std::string, 256>& byte_level_chars() { return byte_level_tables().chars; }

int byte_level_byte(char32_t cp) { return cp < 512 ? byte_level_tables().bytes[cp] : -1; }

bool is_whitespace(char32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (cp == 0x200C || cp == 0x200D) return true;
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  return (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

StatusOr<std::string> normalize_unicode(std::string_view s, NormalizationForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* norm = nullptr;
  switch (form) {
    case NormalizationForm::kNfc: norm = icu::Normalizer2::getNFCInstance(err); break;
    case NormalizationForm::kNfd: norm = icu::Normalizer2::getNFDInstance(err); break;
    case NormalizationForm::kNfkc: norm = icu::Normalizer2::getNFKCInstance(err); break;
    case NormalizationForm::kNfkd: norm = icu::Normalizer2::getNFKDInstance(err); break;
  }
  if (U_FAILURE(err) || norm == nullptr) {
    return internal_error(std::string("ICU normalizer unavailable: ") + u_errorName(err));
  }
  const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  if (norm->isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
  norm->normalizeUTF8(0, piece, sink, nullptr, err);
  if (U_FAILURE(err)) return internal_error(std::string("ICU normalization failed: ") + u_errorName(err));
  return out;
}

std::string to_lowercase(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  std::string out;
  if (ascii) {
    out.assign(s);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  UErrorCode err = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
  icu::CaseMap::utf8ToLower("", 0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr,
                            err);
  if (U_FAILURE(err)) return std::string(s);
  return out;
}

}  // namespace tessera::tok
