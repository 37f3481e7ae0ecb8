#include "common/tokenizer/regex.h"

#include <algorithm>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/tokenizer/unicode_utils.h"

namespace tessera::tok {
namespace {

// Parses the body of a character class starting just after '[' (and after '^' for the
// outer class), appending a flat PCRE2 class body to `out`; returns the index just past
// the closing ']'. Nested non-negated classes are inlined (a union), which is what
// Oniguruma means by them.
StatusOr<size_t> flatten_class(const std::string& p, size_t i, std::string& out) {
  bool first = true;
  while (i < p.size()) {
    const char c = p[i];
    if (c == ']' && !first) return i + 1;
    first = false;
    if (c == '\\') {
      if (i + 1 >= p.size()) break;
      out.append(p, i, 2);
      i += 2;
      continue;
    }
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close == std::string::npos) return invalid_argument("unterminated POSIX class in regex");
      out.append(p, i, close + 2 - i);
      i = close + 2;
      continue;
    }
    if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == '^') {
        return unimplemented("negated nested character class (Oniguruma syntax) is not supported");
      }
      TESSERA_ASSIGN_OR_RETURN(i, flatten_class(p, i + 1, out));
      continue;
    }
    if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      return unimplemented("character class intersection '&&' (Oniguruma syntax) is not supported");
    }
    out.push_back(c);
    ++i;
  }
  return invalid_argument("unterminated character class in regex");
}

}  // namespace

StatusOr<std::string> translate_oniguruma_pattern(const std::string& p) {
  std::string out;
  out.reserve(p.size());
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      out.append(p, i, std::min<size_t>(2, p.size() - i));
      i += 2;
      continue;
    }
    if (c == '[') {
      out.push_back('[');
      ++i;
      if (i < p.size() && p[i] == '^') {
        out.push_back('^');
        ++i;
      }
      // A ']' right after '[' or '[^' is a literal in both dialects.
      if (i < p.size() && p[i] == ']') {
        out.append("\\]");
        ++i;
      }
      std::string body;
      TESSERA_ASSIGN_OR_RETURN(i, flatten_class(p, i, body));
      out.append(body);
      out.push_back(']');
      continue;
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

std::string regex_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) {
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

StatusOr<std::shared_ptr<const Regex>> Regex::compile(const std::string& pattern, bool literal) {
  std::string translated;
  if (literal) {
    translated = regex_escape(pattern);
  } else {
    auto t = translate_oniguruma_pattern(pattern);
    if (!t.is_ok()) return t.status().with_context("regex '" + pattern + "'");
    translated = std::move(t).value();
  }
  // Tokenizer patterns come from tokenizer.json, whose JSON reader accepts only UTF-8.
  return compile_translated(pattern, translated, PCRE2_NO_UTF_CHECK);
}

StatusOr<std::shared_ptr<const Regex>> Regex::compile_pcre2(const std::string& pattern) {
  return compile_translated(pattern, pattern, 0);  // PCRE2 checks the pattern is UTF-8
}

StatusOr<std::shared_ptr<const Regex>> Regex::compile_translated(const std::string& pattern,
                                                                 const std::string& translated, uint32_t options) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | options, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument("regex '" + pattern + "' does not compile at offset " + std::to_string(err_offset) +
                            ": " + reinterpret_cast<const char*>(buf));
  }
  std::shared_ptr<Regex> re(new Regex());
  re->pattern_ = pattern;
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // Match data is per call: a compiled pattern is shared across threads, match data is not.
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), last_end, 0, md, nullptr)
                        : pcre2_match(code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: no further matches
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_match_end == e) {
      // Step over one whole character, as Oniguruma's iterator does.
      last_end += last_end < text.size() ? utf8_sequence_length(static_cast<unsigned char>(text[last_end])) : 1;
      continue;
    }
    out.emplace_back(s, e);
    last_end = e;
    have_last = true;
    last_match_end = e;
  }
  pcre2_match_data_free(md);
}

bool Regex::search(std::string_view text) const {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  // pcre2_match (not pcre2_jit_match) checks the subject is UTF-8, then runs the JIT code.
  const int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::vector<std::pair<size_t, size_t>> matches;
  find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    out.append(text.substr(prev, s - prev));
    out.append(replacement);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace tessera::tok
