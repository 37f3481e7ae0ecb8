#include "coordinator/api/jinja/lexer.h"

#include <cctype>

#include "coordinator/api/jinja/unicode.h"

namespace tessera::jinja {
namespace {

[[noreturn]] void syntax_error(int line, const std::string& what) {
  throw ParseError{StatusCode::kInvalidArgument, "line " + std::to_string(line) + ": " + what};
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string normalize(std::string_view source, bool keep_trailing_newline) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!keep_trailing_newline && !s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// A string literal's value, with Python's escapes (\n, \t, \xhh, \uXXXX, ...); unknown
// escapes stay as written, as in Python.
std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    auto hex = [&](size_t digits) {
      char32_t c = 0;
      for (size_t k = 1; k <= digits; ++k) {
        if (i + k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + k]))) return false;
        const char h = body[i + k];
        c = c * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      utf8_append(out, c);
      i += digits;
      return true;
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // a line continuation
      case '0': out += '\0'; break;
      case 'x':
        if (!hex(2)) out += "\\x";
        break;
      case 'u':
        if (!hex(4)) out += "\\u";
        break;
      case 'U':
        if (!hex(8)) out += "\\U";
        break;
      default:
        out += '\\';
        out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& o) : src_(std::move(source)), o_(o) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the last tag end consumed a newline (or nothing came yet)
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit_text(std::move(text), pos_);
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char modifier = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (modifier != '+' && o_.lstrip_blocks && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k) blank = blank && is_space(text[k]);
          if (blank) text.resize(l_pos);
        }
      }
      emit_text(std::move(text), pos_);
      advance_to(start);
      const int tag_line = line_;
      size_t body = start + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      advance_to(body);
      if (kind == '#') {
        const size_t end = src_.find("#}", body);
        if (end == std::string::npos) syntax_error(tag_line, "unclosed comment {# opened here");
        const char before = end > body ? src_[end - 1] : '\0';
        advance_to(end + 2);
        line_starting = finish_tag(before == '-' ? '-' : before == '+' ? '+' : '\0', true);
        continue;
      }
      if (kind == '%' && try_raw(tag_line, &line_starting)) continue;
      line_starting = lex_tag(kind == '{', tag_line);
    }
    tokens_.push_back({TokenType::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  void advance_to(size_t p) {
    for (; pos_ < p; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  void emit_text(std::string text, size_t at) {
    if (text.empty()) return;
    int line = line_;
    (void)at;
    tokens_.push_back({TokenType::kText, std::move(text), line});
  }

  // After a tag's end: "-" eats the whitespace that follows; a block or comment end without
  // "+" eats one newline (trim_blocks). Returns whether a newline was the last thing eaten.
  bool finish_tag(char modifier, bool is_block) {
    if (modifier == '-') {
      bool newline = false;
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        newline = src_[pos_] == '\n';
        advance_to(pos_ + 1);
      }
      return newline;
    }
    if (modifier != '+' && is_block && o_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  // {% raw %}...{% endraw %}: the body is text, untouched.
  bool try_raw(int tag_line, bool* line_starting) {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    char modifier = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) modifier = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    advance_to(p + 2);
    finish_tag(modifier, true);
    // Find {% endraw %} (with optional modifiers and spaces).
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      const char open_mod = (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) ? src_[r++] : '\0';
      while (r < src_.size() && is_space(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && is_space(src_[r])) ++r;
      char close_mod = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) close_mod = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos_, q - pos_);
      if (open_mod == '-') {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      }
      emit_text(std::move(body), pos_);
      advance_to(r + 2);
      *line_starting = finish_tag(close_mod, true);
      return true;
    }
    syntax_error(tag_line, "{% raw %} without {% endraw %}");
  }

  // The tokens of one {{ }} or {% %} tag. Returns whether its end consumed a newline.
  bool lex_tag(bool is_variable, int tag_line) {
    tokens_.push_back({is_variable ? TokenType::kVariableBegin : TokenType::kBlockBegin, "", tag_line});
    const char close = is_variable ? '}' : '%';
    int depth = 0;  // open brackets: a tag end inside them is not one (as Jinja2's lexer)
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        syntax_error(tag_line, std::string("unclosed tag ") + (is_variable ? "{{" : "{%") + " opened here");
      const char c = src_[pos_];
      if (depth == 0) {
        char modifier = '\0';
        size_t p = pos_;
        if ((c == '-' || (c == '+' && !is_variable)) && p + 1 < src_.size()) modifier = src_[p++];
        if (src_.compare(p, 2, std::string(1, close) + "}") == 0) {
          tokens_.push_back({is_variable ? TokenType::kVariableEnd : TokenType::kBlockEnd, "", line_});
          advance_to(p + 2);
          return finish_tag(modifier, !is_variable);
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        push(TokenType::kName, src_.substr(pos_, e - pos_), e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|", ";"};
        bool matched = false;
        for (const char* op : kOps) {
          const std::string_view sv(op);
          if (src_.compare(pos_, sv.size(), sv) == 0) {
            if (sv == "(" || sv == "[" || sv == "{") ++depth;
            if ((sv == ")" || sv == "]" || sv == "}") && depth > 0) --depth;
            push(TokenType::kOperator, std::string(sv), pos_ + sv.size());
            matched = true;
            break;
          }
        }
        if (!matched) syntax_error(line_, std::string("unexpected character '") + c + "' in a tag");
      }
    }
  }

  void push(TokenType t, std::string text, size_t end) {
    tokens_.push_back({t, std::move(text), line_});
    advance_to(end);
  }

  void lex_number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';  // x.0.1 is two lookups
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        is_float = true;
        e = x;
        digits();
      }
    }
    std::string text;
    for (size_t k = pos_; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    push(is_float ? TokenType::kFloat : TokenType::kInt, text, e);
  }

  void lex_string(char quote) {
    const int line = line_;
    size_t e = pos_ + 1;
    while (e < src_.size() && src_[e] != quote) e += src_[e] == '\\' ? 2 : 1;
    if (e >= src_.size()) syntax_error(line, "unterminated string literal");
    tokens_.push_back({TokenType::kString, unescape(std::string_view(src_).substr(pos_ + 1, e - pos_ - 1)), line});
    advance_to(e + 1);
  }

  std::string src_;
  LexOptions o_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(normalize(source, options.keep_trailing_newline), options).run();
}

}  // namespace tessera::jinja
