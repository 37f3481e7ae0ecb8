#include "coordinator/api/grammars/gbnf_parser.h"

#include <set>
#include <string>
#include <vector>

#include "coordinator/engine/structured/codepoint_set.h"

namespace tessera::structured {

using Node = GrammarBuilder::Node;

namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

class GbnfParser {
 public:
  GbnfParser(GrammarBuilder& g, std::string_view t) : g_(g), t_(t) {}

  StatusOr<int> parse() {
    std::set<int> defined;
    skip_space();
    while (!at_end() && error_.empty()) {
      const size_t name_at = pos_;
      const std::string name = read_name();
      if (name.empty()) {
        fail("expected a rule name");
        break;
      }
      skip_space();
      if (t_.substr(pos_, 3) != "::=") {
        fail("expected '::=' after rule name '" + name + "'");
        break;
      }
      pos_ += 3;
      const int rule = g_.rule(name);
      if (!defined.insert(rule).second) {
        pos_ = name_at;
        fail("rule '" + name + "' is defined twice");
        break;
      }
      Node body = alternation(0);
      if (!error_.empty()) break;
      g_.define(rule, body);
      skip_space();
    }
    if (!error_.empty()) return Status(StatusCode::kInvalidArgument, error_);
    int root = -1;
    for (int r : defined)
      if (g_.rule_name(r) == "root") root = r;
    if (root < 0) return Status(StatusCode::kInvalidArgument, "the grammar defines no 'root' rule");
    // Every defined rule must be reachable from root: an unused rule is almost always a typo.
    std::set<int> seen = {root};
    std::vector<int> todo = {root};
    while (!todo.empty()) {
      const int r = todo.back();
      todo.pop_back();
      for (int x : g_.references(r))
        if (seen.insert(x).second) todo.push_back(x);
    }
    for (int r : defined) {
      if (!seen.count(r))
        return Status(StatusCode::kInvalidArgument, "rule '" + g_.rule_name(r) + "' is never used (unreachable from root)");
    }
    return root;
  }

 private:
  bool at_end() const { return pos_ >= t_.size(); }
  char peek() const { return at_end() ? '\0' : t_[pos_]; }

  void fail(const std::string& what) {
    if (!error_.empty()) return;
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    error_ = "grammar line " + std::to_string(line) + ":" + std::to_string(col) + ": " + what;
  }

  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(peek())) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  // True at "name ::=": the next rule starts, this one's body ended.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < t_.size() && name_char(t_[p])) ++p;
    if (p == pos_) return false;
    while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t')) ++p;
    return t_.substr(p, 3) == "::=";
  }

  Node alternation(int depth) {
    if (depth > 100) {
      fail("groups nest too deeply");
      return g_.empty();
    }
    std::vector<Node> alts = {sequence(depth)};
    while (error_.empty()) {
      skip_space();
      if (peek() != '|') break;
      ++pos_;
      alts.push_back(sequence(depth));
    }
    return g_.alt(std::move(alts));
  }

  Node sequence(int depth) {
    std::vector<Node> items;
    while (error_.empty()) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      Node a = atom(depth);
      items.push_back(quantified(a));
    }
    return g_.seq(std::move(items));
  }

  Node quantified(Node a) {
    while (error_.empty() && !at_end()) {
      const char c = peek();
      if (c == '*') {
        ++pos_;
        a = g_.star(a);
      } else if (c == '+') {
        ++pos_;
        a = g_.plus(a);
      } else if (c == '?') {
        ++pos_;
        a = g_.optional(a);
      } else if (c == '{') {
        ++pos_;
        int min = number();
        int max = min;
        if (peek() == ',') {
          ++pos_;
          skip_space();
          max = peek() == '}' ? GrammarBuilder::kUnbounded : number();
        }
        skip_space();
        if (peek() != '}') {
          fail("expected '}' to close a repetition");
          return a;
        }
        ++pos_;
        if (min < 0 || (max != GrammarBuilder::kUnbounded && max < 0)) return a;
        if (max != GrammarBuilder::kUnbounded && max < min) {
          fail("repetition with max below min");
          return a;
        }
        a = g_.repeat(a, min, max);
      } else {
        break;
      }
    }
    return a;
  }

  int number() {
    skip_space();
    if (!(peek() >= '0' && peek() <= '9')) {
      fail("expected a number");
      return -1;
    }
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (t_[pos_++] - '0');
      if (v > 1000) {
        fail("repetition count over 1000");
        return -1;
      }
    }
    skip_space();
    return static_cast<int>(v);
  }

  uint32_t codepoint() {
    const auto c = static_cast<unsigned char>(t_[pos_++]);
    const int extra = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (extra < 0) {
      fail("invalid UTF-8");
      return 0;
    }
    uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
    for (int i = 0; i < extra; ++i) {
      if (at_end() || (static_cast<unsigned char>(peek()) & 0xC0) != 0x80) {
        fail("invalid UTF-8");
        return 0;
      }
      cp = (cp << 6) | (static_cast<unsigned char>(t_[pos_++]) & 0x3F);
    }
    return cp;
  }

  // One (possibly escaped) character of a literal or class.
  uint32_t character() {
    if (peek() != '\\') return codepoint();
    ++pos_;
    if (at_end()) {
      fail("text ends inside an escape");
      return 0;
    }
    const char c = t_[pos_++];
    auto hex = [&](int n) -> uint32_t {
      uint32_t v = 0;
      for (int i = 0; i < n; ++i) {
        const char h = peek();
        const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) {
          fail("invalid hex escape");
          return 0;
        }
        ++pos_;
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > kMaxCodepoint || (v >= 0xD800 && v <= 0xDFFF)) fail("escape is not a Unicode scalar value");
      return v;
    };
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': return '\\';
      case '"': return '"';
      case '[': return '[';
      case ']': return ']';
      case '-': return '-';
      case '^': return '^';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default:
        --pos_;
        fail(std::string("unknown escape '\\") + c + "'");
        return 0;
    }
  }

  Node atom(int depth) {
    const char c = peek();
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (error_.empty()) {
        if (at_end() || peek() == '\n') {
          fail("unterminated string literal");
          return g_.empty();
        }
        if (peek() == '"') break;
        append_utf8(bytes, character());
      }
      ++pos_;
      return g_.literal(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (peek() == '^') {
        negate = true;
        ++pos_;
      }
      CodepointSet set;
      while (error_.empty()) {
        if (at_end()) {
          fail("unterminated character class");
          return g_.empty();
        }
        if (peek() == ']') break;
        const uint32_t lo = character();
        uint32_t hi = lo;
        if (peek() == '-' && pos_ + 1 < t_.size() && t_[pos_ + 1] != ']') {
          ++pos_;
          hi = character();
          if (hi < lo) {
            fail("character range out of order");
            return g_.empty();
          }
        }
        set.add(lo, hi);
      }
      ++pos_;
      return utf8_class(g_, negate ? set.complement() : set);
    }
    if (c == '.') {
      ++pos_;
      return utf8_class(g_, CodepointSet::of(0, kMaxCodepoint));
    }
    if (c == '(') {
      ++pos_;
      Node inner = alternation(depth + 1);
      skip_space();
      if (peek() != ')') {
        fail("expected ')'");
        return inner;
      }
      ++pos_;
      return inner;
    }
    if (name_char(c)) return g_.ref(g_.rule(read_name()));
    fail(std::string("unexpected character '") + c + "'");
    return g_.empty();
  }

  GrammarBuilder& g_;
  std::string_view t_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

StatusOr<int> parse_gbnf(GrammarBuilder& g, std::string_view text) { return GbnfParser(g, text).parse(); }

}  // namespace tessera::structured
