#include "coordinator/api/grammars/regex_compiler.h"

#include <string>
#include <vector>

#include "coordinator/engine/structured/codepoint_set.h"

namespace tessera::structured {

using Node = GrammarBuilder::Node;

namespace {

class RegexParser {
 public:
  RegexParser(GrammarBuilder& g, std::string_view p, RegexText text) : g_(g), p_(p), text_(text) {}

  StatusOr<Node> parse() {
    if (!p_.empty() && p_[0] == '^') pos_ = 1;
    Node n = alternation(0);
    if (!error_.empty()) return fail();
    if (pos_ < p_.size()) {
      if (p_[pos_] == ')') return fail_at("unbalanced ')'");
      return fail_at("unexpected character");
    }
    return n;
  }

 private:
  Status fail() { return Status(StatusCode::kInvalidArgument, error_); }
  Status fail_at(const std::string& what) {
    set_error(what);
    return fail();
  }
  void set_error(const std::string& what) {
    if (error_.empty()) error_ = "regex '" + std::string(p_) + "': " + what + " at offset " + std::to_string(pos_);
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek() const { return at_end() ? '\0' : p_[pos_]; }

  // One UTF-8 code point of the pattern text.
  uint32_t next_codepoint() {
    const auto c = static_cast<unsigned char>(p_[pos_++]);
    int extra = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (extra < 0) {
      set_error("invalid UTF-8");
      return 0;
    }
    uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
    for (int i = 0; i < extra; ++i) {
      if (at_end() || (static_cast<unsigned char>(p_[pos_]) & 0xC0) != 0x80) {
        set_error("invalid UTF-8");
        return 0;
      }
      cp = (cp << 6) | (static_cast<unsigned char>(p_[pos_++]) & 0x3F);
    }
    return cp;
  }

  Node cls(const CodepointSet& s) {
    return text_ == RegexText::kJsonString ? json_string_class(g_, s) : utf8_class(g_, s);
  }

  Node alternation(int depth) {
    if (depth > 100) {
      set_error("groups nest too deeply");
      return g_.empty();
    }
    std::vector<Node> alts = {concat(depth)};
    while (error_.empty() && peek() == '|') {
      ++pos_;
      alts.push_back(concat(depth));
    }
    return g_.alt(std::move(alts));
  }

  Node concat(int depth) {
    std::vector<Node> items;
    while (error_.empty() && !at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        ++pos_;
        if (!at_end()) set_error("'$' is supported only at the end of the pattern");
        break;
      }
      Node a = atom(depth);
      items.push_back(quantified(a));
    }
    return g_.seq(std::move(items));
  }

  Node quantified(Node a) {
    while (error_.empty() && !at_end()) {
      const char c = peek();
      int min = 0, max = 0;
      if (c == '*') {
        ++pos_;
        max = GrammarBuilder::kUnbounded;
      } else if (c == '+') {
        ++pos_;
        min = 1;
        max = GrammarBuilder::kUnbounded;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{' && braces(&min, &max)) {
      } else {
        break;
      }
      if (!error_.empty()) break;
      if (peek() == '?') ++pos_;  // lazy: the same language
      else if (peek() == '+') set_error("possessive quantifiers are not supported");
      a = g_.repeat(a, min, max);
    }
    return a;
  }

  // {n}, {n,}, {n,m}; false (nothing consumed) when '{' does not start one, as in JavaScript.
  bool braces(int* min, int* max) {
    size_t at = pos_ + 1;
    auto number = [&](int* out) {
      size_t start = at;
      long v = 0;
      while (at < p_.size() && p_[at] >= '0' && p_[at] <= '9' && v <= 1000000) v = v * 10 + (p_[at++] - '0');
      *out = static_cast<int>(std::min<long>(v, 1000001));
      return at > start;
    };
    if (!number(min)) return false;
    if (at < p_.size() && p_[at] == '}') {
      *max = *min;
    } else if (at < p_.size() && p_[at] == ',') {
      ++at;
      if (at < p_.size() && p_[at] == '}') {
        *max = GrammarBuilder::kUnbounded;
      } else if (!number(max) || at >= p_.size() || p_[at] != '}') {
        return false;
      }
    } else {
      return false;
    }
    pos_ = at + 1;
    if (*min > kMaxRegexRepeat || *max > kMaxRegexRepeat)
      set_error("repetition count over " + std::to_string(kMaxRegexRepeat));
    else if (*max != GrammarBuilder::kUnbounded && *max < *min)
      set_error("repetition {" + std::to_string(*min) + "," + std::to_string(*max) + "} has max below min");
    return true;
  }

  Node atom(int depth) {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
          while (!at_end() && peek() != '>') ++pos_;  // a named group: the name changes nothing
          if (at_end()) {
            set_error("unterminated group name");
            return g_.empty();
          }
          ++pos_;
        } else if (peek() == 'P' && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
          while (!at_end() && peek() != '>') ++pos_;
          if (at_end()) {
            set_error("unterminated group name");
            return g_.empty();
          }
          ++pos_;
        } else if (peek() == '=' || peek() == '!' || peek() == '<') {
          set_error("lookaround assertions are not supported");
          return g_.empty();
        } else {
          set_error("inline flags and other (?...) groups are not supported");
          return g_.empty();
        }
      }
      Node inner = alternation(depth + 1);
      if (!error_.empty()) return inner;
      if (peek() != ')') {
        set_error("missing ')'");
        return inner;
      }
      ++pos_;
      return inner;
    }
    if (c == '[') return bracket();
    if (c == '.') {
      ++pos_;
      // JavaScript's '.' (what validators such as ajv run): anything but a line terminator.
      CodepointSet terminators = CodepointSet::of('\n', '\n');
      terminators.add('\r', '\r');
      terminators.add(0x2028, 0x2029);
      return cls(terminators.complement());
    }
    if (c == '*' || c == '+' || c == '?') {
      set_error("quantifier with nothing to repeat");
      return g_.empty();
    }
    if (c == '^') {
      set_error("'^' is supported only at the start of the pattern");
      return g_.empty();
    }
    if (c == '\\') {
      CodepointSet s;
      if (escape(&s, false)) return cls(s);
      return g_.empty();
    }
    const uint32_t cp = next_codepoint();
    return cls(CodepointSet::of(cp, cp));
  }

  static CodepointSet digits() { return CodepointSet::of('0', '9'); }
  static CodepointSet word() {
    CodepointSet s = CodepointSet::of('a', 'z');
    s.add('A', 'Z');
    s.add('0', '9');
    s.add('_', '_');
    return s;
  }
  // JavaScript's \s, so that \S excludes every character a validator calls a space.
  static CodepointSet space() {
    CodepointSet s = CodepointSet::of('\t', '\r');  // \t \n \v \f \r
    s.add(' ', ' ');
    s.add(0xA0, 0xA0);
    s.add(0x1680, 0x1680);
    s.add(0x2000, 0x200A);
    s.add(0x2028, 0x2029);
    s.add(0x202F, 0x202F);
    s.add(0x205F, 0x205F);
    s.add(0x3000, 0x3000);
    s.add(0xFEFF, 0xFEFF);
    return s;
  }

  int hex_digits(int count) {
    if (pos_ + static_cast<size_t>(count) > p_.size()) {
      set_error("incomplete hex escape");
      return -1;
    }
    int v = 0;
    for (int i = 0; i < count; ++i) {
      const char h = p_[pos_++];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) {
        set_error("invalid hex escape");
        return -1;
      }
      v = v * 16 + d;
    }
    return v;
  }

  // After '\': the set it stands for. In a bracket, \b is a backspace.
  bool escape(CodepointSet* out, bool in_bracket) {
    ++pos_;
    if (at_end()) {
      set_error("pattern ends with '\\'");
      return false;
    }
    const char c = p_[pos_];
    switch (c) {
      case 'd': ++pos_; *out = digits(); return true;
      case 'D': ++pos_; *out = digits().complement(); return true;
      case 'w': ++pos_; *out = word(); return true;
      case 'W': ++pos_; *out = word().complement(); return true;
      case 's': ++pos_; *out = space(); return true;
      case 'S': ++pos_; *out = space().complement(); return true;
      case 'n': ++pos_; *out = CodepointSet::of('\n', '\n'); return true;
      case 't': ++pos_; *out = CodepointSet::of('\t', '\t'); return true;
      case 'r': ++pos_; *out = CodepointSet::of('\r', '\r'); return true;
      case 'f': ++pos_; *out = CodepointSet::of('\f', '\f'); return true;
      case 'v': ++pos_; *out = CodepointSet::of('\v', '\v'); return true;
      case '0': ++pos_; *out = CodepointSet::of(0, 0); return true;
      case 'x': {
        ++pos_;
        const int v = hex_digits(2);
        if (v < 0) return false;
        *out = CodepointSet::of(static_cast<uint32_t>(v), static_cast<uint32_t>(v));
        return true;
      }
      case 'u': {
        ++pos_;
        const int v = hex_digits(4);
        if (v < 0) return false;
        if (v >= 0xD800 && v <= 0xDFFF) {
          set_error("surrogate code point escape");
          return false;
        }
        *out = CodepointSet::of(static_cast<uint32_t>(v), static_cast<uint32_t>(v));
        return true;
      }
      case 'b':
        if (in_bracket) {
          ++pos_;
          *out = CodepointSet::of('\b', '\b');
          return true;
        }
        set_error("word boundaries (\\b) are not supported");
        return false;
      case 'B': set_error("word boundaries (\\B) are not supported"); return false;
      case 'p':
      case 'P': set_error("Unicode property classes (\\p{...}) are not supported"); return false;
      case 'k': set_error("backreferences are not supported"); return false;
      default: break;
    }
    if (c >= '1' && c <= '9') {
      set_error("backreferences are not supported");
      return false;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      set_error(std::string("unknown escape '\\") + c + "'");
      return false;
    }
    const uint32_t cp = next_codepoint();
    *out = CodepointSet::of(cp, cp);
    return true;
  }

  Node bracket() {
    ++pos_;  // '['
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodepointSet set;
    bool first = true;
    while (error_.empty()) {
      if (at_end()) {
        set_error("missing ']'");
        return g_.empty();
      }
      if (peek() == ']' && !first) break;
      first = false;
      CodepointSet item;
      uint32_t lo = 0;
      bool single = false;
      if (peek() == '\\') {
        if (!escape(&item, true)) return g_.empty();
        single = item.ranges().size() == 1 && item.ranges()[0].first == item.ranges()[0].second;
        lo = single ? item.ranges()[0].first : 0;
      } else if (peek() == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
        set_error("POSIX classes ([:alpha:]) are not supported");
        return g_.empty();
      } else {
        lo = next_codepoint();
        item = CodepointSet::of(lo, lo);
        single = true;
      }
      if (single && peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi = 0;
        if (peek() == '\\') {
          CodepointSet h;
          if (!escape(&h, true)) return g_.empty();
          if (h.ranges().size() != 1 || h.ranges()[0].first != h.ranges()[0].second) {
            set_error("a class escape cannot end a range");
            return g_.empty();
          }
          hi = h.ranges()[0].first;
        } else {
          hi = next_codepoint();
        }
        if (hi < lo) {
          set_error("range out of order");
          return g_.empty();
        }
        item = CodepointSet::of(lo, hi);
      }
      set.add(item);
    }
    ++pos_;  // ']'
    if (negate) set = set.complement();
    return cls(set);
  }

  GrammarBuilder& g_;
  std::string_view p_;
  RegexText text_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

StatusOr<Node> compile_regex(GrammarBuilder& g, std::string_view pattern, RegexText text) {
  return RegexParser(g, pattern, text).parse();
}

}  // namespace tessera::structured
