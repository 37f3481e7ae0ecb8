#include "coordinator/chat_template.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

namespace tessera {
namespace chat {

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
using Map = std::map<std::string, Value>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kString, kList, kMap };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Map> map;

  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value of(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value of(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value of(std::string x) { Value v; v.kind = Kind::kString; v.s = std::move(x); return v; }
  static Value of(List x) { Value v; v.kind = Kind::kList; v.list = std::make_shared<const List>(std::move(x)); return v; }
  static Value of(Map x) { Value v; v.kind = Kind::kMap; v.map = std::make_shared<const Map>(std::move(x)); return v; }
};

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.b;
    case Value::Kind::kInt: return v.i != 0;
    case Value::Kind::kString: return !v.s.empty();
    case Value::Kind::kList: return !v.list->empty();
    case Value::Kind::kMap: return !v.map->empty();
  }
  return false;
}

std::string repr(const Value& v);

// What {{ v }} prints (Python's str()).
std::string to_text(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kString: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  if (v.kind == Value::Kind::kString) return "'" + v.s + "'";
  if (v.kind == Value::Kind::kList) {
    std::string out = "[";
    for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
    return out + "]";
  }
  if (v.kind == Value::Kind::kMap) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, val] : *v.map) {
      out += (first ? "'" : ", '") + key + "': " + repr(val);
      first = false;
    }
    return out + "}";
  }
  return to_text(v);
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool a_num = a.kind == K::kInt || a.kind == K::kBool, b_num = b.kind == K::kInt || b.kind == K::kBool;
  if (a_num && b_num) return (a.kind == K::kInt ? a.i : a.b) == (b.kind == K::kInt ? b.i : b.b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.s == b.s;
    case K::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::kMap: return repr(a) == repr(b);
    default: return false;
  }
}

// ---------------------------------------------------------------- syntax tree

struct Expr {
  enum class Op { kLiteral, kVar, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kAnd, kOr, kTernary, kList };
  Op op = Op::kLiteral;
  std::string name;  // variable, attribute, filter, test, binary operator, callee
  Value literal;
  bool negate = false;  // "is not", "not in"
  std::vector<std::unique_ptr<Expr>> args;  // operands (for kSlice: object, start|null, stop|null)
  int line = 1;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet };
  Kind kind = Kind::kText;
  std::string text;
  std::shared_ptr<Expr> expr;  // output, for iterable, set value
  std::vector<std::pair<std::shared_ptr<Expr>, std::vector<Node>>> branches;  // if / elif
  std::vector<Node> else_body;  // if's else, for's else
  std::vector<std::string> names;  // for's loop variables, set's target
  std::vector<Node> body;          // for's body
  int line = 1;
};

namespace {

Status unsupported(const std::string& what, int line) {
  return unimplemented("chat template line " + std::to_string(line) + ": unsupported " + what);
}
Status syntax_error(const std::string& what, int line) {
  return invalid_argument("chat template line " + std::to_string(line) + ": " + what);
}

// ---------------------------------------------------------------- expression tokens

struct Token {
  enum class Kind { kName, kString, kInt, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  int64_t number = 0;
};

StatusOr<std::vector<Token>> lex_expression(std::string_view src, int line) {
  std::vector<Token> out;
  size_t p = 0;
  while (p < src.size()) {
    const char c = src[p];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++p;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      out.push_back({Token::Kind::kName, std::string(src.substr(p, e - p))});
      p = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = p;
      while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
      if (e < src.size() && src[e] == '.') return unsupported("number '" + std::string(src.substr(p, e - p + 1)) + "...' (only integers)", line);
      Token t{Token::Kind::kInt, std::string(src.substr(p, e - p))};
      t.number = std::stoll(t.text);
      out.push_back(t);
      p = e;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t e = p + 1;
      for (; e < src.size() && src[e] != c; ++e) {
        if (src[e] != '\\' || e + 1 >= src.size()) {
          s += src[e];
          continue;
        }
        const char n = src[++e];
        switch (n) {
          case 'n': s += '\n'; break;
          case 't': s += '\t'; break;
          case 'r': s += '\r'; break;
          case '\\': s += '\\'; break;
          case '\'': s += '\''; break;
          case '"': s += '"'; break;
          default: s += '\\'; s += n;
        }
      }
      if (e >= src.size()) return syntax_error("unterminated string", line);
      out.push_back({Token::Kind::kString, std::move(s)});
      p = e + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/", "%", "~",
                                   "(", ")", "[", "]", ".", ",", ":", "|", "=", "{", "}"};
      bool matched = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (src.substr(p, o.size()) == o) {
          out.push_back({Token::Kind::kOp, std::string(o)});
          p += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) return syntax_error(std::string("unexpected character '") + c + "'", line);
    }
  }
  out.push_back({Token::Kind::kEnd, ""});
  return out;
}

// ---------------------------------------------------------------- expression parser

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  StatusOr<ExprPtr> expression() { return ternary(); }
  bool at_end() const { return t_[p_].kind == Token::Kind::kEnd; }
  bool is_name(const char* s) const { return t_[p_].kind == Token::Kind::kName && t_[p_].text == s; }
  bool is_op(const char* s) const { return t_[p_].kind == Token::Kind::kOp && t_[p_].text == s; }
  const Token& peek() const { return t_[p_]; }
  Token next() { return t_[p_].kind == Token::Kind::kEnd ? t_[p_] : t_[p_++]; }
  Status expect_op(const char* s) {
    if (!is_op(s)) return syntax_error(std::string("expected '") + s + "' but found '" + peek().text + "'", line_);
    ++p_;
    return Status::ok();
  }
  StatusOr<std::string> name() {
    if (peek().kind != Token::Kind::kName) return syntax_error("expected a name but found '" + peek().text + "'", line_);
    return next().text;
  }

 private:
  ExprPtr make(Expr::Op op, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->name = std::move(name);
    e->line = line_;
    return e;
  }

  StatusOr<ExprPtr> ternary() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr value, or_expr());
    if (!is_name("if")) return value;
    ++p_;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, or_expr());
    ExprPtr otherwise = make(Expr::Op::kLiteral);  // Jinja: undefined without an else
    if (is_name("else")) {
      ++p_;
      TESSERA_ASSIGN_OR_RETURN(otherwise, ternary());
    }
    ExprPtr e = make(Expr::Op::kTernary);
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(otherwise));
    return e;
  }
  StatusOr<ExprPtr> or_expr() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, and_expr());
    while (is_name("or")) {
      ++p_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, and_expr());
      ExprPtr e = make(Expr::Op::kOr);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> and_expr() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, not_expr());
    while (is_name("and")) {
      ++p_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, not_expr());
      ExprPtr e = make(Expr::Op::kAnd);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> not_expr() {
    if (!is_name("not")) return compare();
    ++p_;
    TESSERA_ASSIGN_OR_RETURN(ExprPtr inner, not_expr());
    ExprPtr e = make(Expr::Op::kNot);
    e->args.push_back(std::move(inner));
    return e;
  }
  StatusOr<ExprPtr> compare() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, concat());
    for (;;) {
      std::string op;
      bool negate = false;
      if (peek().kind == Token::Kind::kOp &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && t_[p_ + 1].kind == Token::Kind::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "in";
        negate = true;
      } else {
        return left;
      }
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, concat());
      ExprPtr e = make(Expr::Op::kBinary, op);
      e->negate = negate;
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
  }
  StatusOr<ExprPtr> concat() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, sum());
    while (is_op("~")) {
      ++p_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, sum());
      ExprPtr e = make(Expr::Op::kBinary, "~");
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> sum() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, product());
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, product());
      ExprPtr e = make(Expr::Op::kBinary, op);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> product() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr left, unary());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr right, unary());
      ExprPtr e = make(Expr::Op::kBinary, op);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }
  StatusOr<ExprPtr> unary() {
    if (is_op("-")) {
      ++p_;
      TESSERA_ASSIGN_OR_RETURN(ExprPtr inner, unary());
      ExprPtr e = make(Expr::Op::kNeg);
      e->args.push_back(std::move(inner));
      return e;
    }
    if (is_op("**")) return unsupported("operator '**'", line_);
    return postfix();
  }
  Status call_args(Expr& e) {
    TESSERA_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && t_[p_ + 1].kind == Token::Kind::kOp && t_[p_ + 1].text == "=")
        return unsupported("keyword argument '" + peek().text + "='", line_);
      TESSERA_ASSIGN_OR_RETURN(ExprPtr a, expression());
      e.args.push_back(std::move(a));
      if (!is_op(",")) break;
      ++p_;
    }
    return expect_op(")");
  }
  StatusOr<ExprPtr> postfix() {
    TESSERA_ASSIGN_OR_RETURN(ExprPtr e, primary());
    for (;;) {
      if (is_op(".")) {
        ++p_;
        TESSERA_ASSIGN_OR_RETURN(std::string attr, name());
        ExprPtr a = make(Expr::Op::kAttr, attr);
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        ++p_;
        ExprPtr start, stop;
        if (!is_op(":")) {
          TESSERA_ASSIGN_OR_RETURN(start, expression());
        }
        if (is_op(":")) {
          ++p_;
          if (!is_op("]")) {
            TESSERA_ASSIGN_OR_RETURN(stop, expression());
          }
          if (is_op(":")) return unsupported("slice step", line_);
          ExprPtr s = make(Expr::Op::kSlice);
          s->args.push_back(std::move(e));
          s->args.push_back(std::move(start));
          s->args.push_back(std::move(stop));
          e = std::move(s);
        } else {
          ExprPtr s = make(Expr::Op::kIndex);
          s->args.push_back(std::move(e));
          s->args.push_back(std::move(start));
          e = std::move(s);
        }
        TESSERA_RETURN_IF_ERROR(expect_op("]"));
      } else if (is_op("(")) {
        // A call: raise_exception(...), or a method (object.method(...)).
        ExprPtr c = make(Expr::Op::kCall);
        c->args.push_back(std::move(e));
        TESSERA_RETURN_IF_ERROR(call_args(*c));
        e = std::move(c);
      } else if (is_op("|")) {
        ++p_;
        TESSERA_ASSIGN_OR_RETURN(std::string filter, name());
        ExprPtr f = make(Expr::Op::kFilter, filter);
        f->args.push_back(std::move(e));
        if (is_op("(")) TESSERA_RETURN_IF_ERROR(call_args(*f));
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        bool negate = false;
        if (is_name("not")) {
          ++p_;
          negate = true;
        }
        TESSERA_ASSIGN_OR_RETURN(std::string test, name());
        ExprPtr t = make(Expr::Op::kTest, test);
        t->negate = negate;
        t->args.push_back(std::move(e));
        if (is_op("(")) TESSERA_RETURN_IF_ERROR(call_args(*t));
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  StatusOr<ExprPtr> primary() {
    const Token t = next();
    switch (t.kind) {
      case Token::Kind::kString: {
        ExprPtr e = make(Expr::Op::kLiteral);
        e->literal = Value::of(t.text);
        // Adjacent string literals concatenate, as in Python.
        while (peek().kind == Token::Kind::kString) e->literal.s += next().text;
        return e;
      }
      case Token::Kind::kInt: {
        ExprPtr e = make(Expr::Op::kLiteral);
        e->literal = Value::of(t.number);
        return e;
      }
      case Token::Kind::kName: {
        ExprPtr e = make(Expr::Op::kLiteral);
        if (t.text == "true" || t.text == "True") e->literal = Value::of(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value::of(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value::none();
        else e = make(Expr::Op::kVar, t.text);
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          TESSERA_ASSIGN_OR_RETURN(ExprPtr inner, expression());
          if (is_op(",")) return unsupported("tuple literal", line_);
          TESSERA_RETURN_IF_ERROR(expect_op(")"));
          return inner;
        }
        if (t.text == "[") {
          ExprPtr e = make(Expr::Op::kList);
          while (!is_op("]")) {
            TESSERA_ASSIGN_OR_RETURN(ExprPtr item, expression());
            e->args.push_back(std::move(item));
            if (!is_op(",")) break;
            ++p_;
          }
          TESSERA_RETURN_IF_ERROR(expect_op("]"));
          return e;
        }
        if (t.text == "{") return unsupported("dict literal", line_);
        return syntax_error("unexpected '" + t.text + "'", line_);
      case Token::Kind::kEnd: break;
    }
    return syntax_error("expression ends too early", line_);
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
};

// ---------------------------------------------------------------- template structure

struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind = Kind::kText;
  std::string text;  // text, or the tag's inside
  int line = 1;
};

bool is_blank(char c) { return c == ' ' || c == '\t'; }

// Splits the source into text, {{ }} and {% %} pieces, applying whitespace control and
// transformers' trim_blocks + lstrip_blocks.
StatusOr<std::vector<Piece>> split_template(std::string_view src) {
  std::vector<Piece> out;
  size_t p = 0;
  int line = 1;
  bool strip_next = false;  // the previous tag ended with '-'
  bool trim_newline = false;  // the previous tag was a block tag (trim_blocks)
  while (p <= src.size()) {
    const size_t open = src.find('{', p);
    size_t tag = std::string_view::npos;
    for (size_t q = open; q != std::string_view::npos && q + 1 < src.size(); q = src.find('{', q + 1)) {
      if (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#') {
        tag = q;
        break;
      }
    }
    std::string text(src.substr(p, tag == std::string_view::npos ? std::string_view::npos : tag - p));
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next) text.erase(0, text.find_first_not_of(" \t\r\n") == std::string::npos ? text.size() : text.find_first_not_of(" \t\r\n"));
    if (tag == std::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::Kind::kText, std::move(text), line});
      break;
    }
    const char kind = src[tag + 1];
    const bool strip_before = tag + 2 < src.size() && src[tag + 2] == '-';
    if (strip_before) {
      const size_t keep = text.find_last_not_of(" \t\r\n");
      text.erase(keep == std::string::npos ? 0 : keep + 1);
    } else if (kind != '{' && !(tag + 2 < src.size() && src[tag + 2] == '+')) {
      // lstrip_blocks: blanks from the start of the line up to a block tag go.
      size_t q = tag;
      while (q > 0 && is_blank(src[q - 1])) --q;
      if (q == 0 || src[q - 1] == '\n') {
        size_t k = text.size();
        while (k > 0 && is_blank(text[k - 1])) --k;
        text.erase(k);
      }
    }
    for (char c : text) line += c == '\n';
    if (!text.empty()) out.push_back({Piece::Kind::kText, std::move(text), line});
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = src.find(close, tag + 2);
    if (end == std::string_view::npos) return syntax_error(std::string("unclosed '{") + kind + "'", line);
    size_t inner_begin = tag + 2 + (strip_before || (tag + 2 < src.size() && src[tag + 2] == '+') ? 1 : 0);
    size_t inner_end = end;
    strip_next = end > inner_begin && src[end - 1] == '-';
    if (strip_next) --inner_end;
    const std::string inner(src.substr(inner_begin, inner_end - inner_begin));
    if (kind == '{') out.push_back({Piece::Kind::kOutput, inner, line});
    if (kind == '%') out.push_back({Piece::Kind::kStatement, inner, line});
    for (size_t k = tag; k < end; ++k) line += src[k] == '\n';
    trim_newline = kind != '{';
    p = end + 2;
  }
  return out;
}

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Parses nodes until one of `terminators` (a statement keyword) or the end; the keyword
  // found is left in *stopped_at ("" at the end).
  Status block(std::vector<Node>& out, const std::vector<std::string>& terminators, std::string* stopped_at,
               ExprParser** stop_parser) {
    while (pos_ < pieces_.size()) {
      const Piece& piece = pieces_[pos_++];
      if (piece.kind == Piece::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.text = piece.text;
        n.line = piece.line;
        out.push_back(std::move(n));
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(std::vector<Token> tokens, lex_expression(piece.text, piece.line));
      parsers_.push_back(std::make_unique<ExprParser>(std::move(tokens), piece.line));
      ExprParser& ep = *parsers_.back();
      if (piece.kind == Piece::Kind::kOutput) {
        Node n;
        n.kind = Node::Kind::kOutput;
        n.line = piece.line;
        TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ep.expression());
        if (!ep.at_end()) return syntax_error("unexpected '" + ep.peek().text + "' in {{ }}", piece.line);
        n.expr = std::move(e);
        out.push_back(std::move(n));
        continue;
      }
      TESSERA_ASSIGN_OR_RETURN(std::string keyword, ep.name());
      if (std::find(terminators.begin(), terminators.end(), keyword) != terminators.end()) {
        *stopped_at = keyword;
        *stop_parser = &ep;
        return Status::ok();
      }
      if (keyword == "elif" || keyword == "else" || keyword == "endif" || keyword == "endfor") {
        return syntax_error("unexpected '{% " + keyword + " %}'", piece.line);
      }
      if (keyword == "if") {
        TESSERA_RETURN_IF_ERROR(parse_if(ep, piece.line, out));
      } else if (keyword == "for") {
        TESSERA_RETURN_IF_ERROR(parse_for(ep, piece.line, out));
      } else if (keyword == "set") {
        Node n;
        n.kind = Node::Kind::kSet;
        n.line = piece.line;
        TESSERA_ASSIGN_OR_RETURN(std::string target, ep.name());
        if (ep.is_op(".")) return unsupported("attribute assignment in set (namespace)", piece.line);
        if (!ep.is_op("=")) return unsupported("block set", piece.line);
        TESSERA_RETURN_IF_ERROR(ep.expect_op("="));
        TESSERA_ASSIGN_OR_RETURN(ExprPtr e, ep.expression());
        if (!ep.at_end()) return syntax_error("unexpected '" + ep.peek().text + "' in set", piece.line);
        n.names.push_back(target);
        n.expr = std::move(e);
        out.push_back(std::move(n));
      } else if (keyword == "generation" || keyword == "endgeneration") {
        // transformers' marker for assistant masks; no output of its own.
      } else {
        return unsupported("statement '{% " + keyword + " %}'", piece.line);
      }
    }
    if (!terminators.empty()) return syntax_error("missing '{% " + terminators.back() + " %}'", pieces_.empty() ? 1 : pieces_.back().line);
    *stopped_at = "";
    return Status::ok();
  }

 private:
  Status parse_if(ExprParser& ep, int line, std::vector<Node>& out) {
    Node n;
    n.kind = Node::Kind::kIf;
    n.line = line;
    ExprParser* cur = &ep;
    for (;;) {
      TESSERA_ASSIGN_OR_RETURN(ExprPtr cond, cur->expression());
      if (!cur->at_end()) return syntax_error("unexpected '" + cur->peek().text + "' in if", line);
      std::vector<Node> body;
      std::string stop;
      ExprParser* next = nullptr;
      TESSERA_RETURN_IF_ERROR(block(body, {"elif", "else", "endif"}, &stop, &next));
      n.branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") {
        cur = next;
        continue;
      }
      if (stop == "else") {
        TESSERA_RETURN_IF_ERROR(block(n.else_body, {"endif"}, &stop, &next));
      }
      break;
    }
    out.push_back(std::move(n));
    return Status::ok();
  }

  Status parse_for(ExprParser& ep, int line, std::vector<Node>& out) {
    Node n;
    n.kind = Node::Kind::kFor;
    n.line = line;
    for (;;) {
      TESSERA_ASSIGN_OR_RETURN(std::string var, ep.name());
      n.names.push_back(var);
      if (!ep.is_op(",")) break;
      ep.next();
    }
    if (!ep.is_name("in")) return syntax_error("expected 'in' in for", line);
    ep.next();
    TESSERA_ASSIGN_OR_RETURN(ExprPtr iterable, ep.expression());
    if (ep.is_name("recursive")) return unsupported("recursive for loop", line);
    if (!ep.at_end()) return syntax_error("unexpected '" + ep.peek().text + "' in for", line);
    n.expr = std::move(iterable);
    std::string stop;
    ExprParser* next = nullptr;
    TESSERA_RETURN_IF_ERROR(block(n.body, {"else", "endfor"}, &stop, &next));
    if (stop == "else") TESSERA_RETURN_IF_ERROR(block(n.else_body, {"endfor"}, &stop, &next));
    out.push_back(std::move(n));
    return Status::ok();
  }

  std::vector<Piece> pieces_;
  size_t pos_ = 0;
  std::vector<std::unique_ptr<ExprParser>> parsers_;  // keep statement parsers alive for elif
};

// ---------------------------------------------------------------- evaluation

class Renderer {
 public:
  explicit Renderer(Map globals) { scopes_.push_back(std::move(globals)); }

  Status render(const std::vector<Node>& nodes, std::string& out) {
    for (const Node& n : nodes) {
      switch (n.kind) {
        case Node::Kind::kText: out += n.text; break;
        case Node::Kind::kOutput: {
          TESSERA_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
          out += to_text(v);
          break;
        }
        case Node::Kind::kSet: {
          TESSERA_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
          scopes_.back()[n.names[0]] = std::move(v);
          break;
        }
        case Node::Kind::kIf: {
          bool done = false;
          for (const auto& [cond, body] : n.branches) {
            TESSERA_ASSIGN_OR_RETURN(Value c, eval(*cond));
            if (truthy(c)) {
              TESSERA_RETURN_IF_ERROR(render(body, out));
              done = true;
              break;
            }
          }
          if (!done) TESSERA_RETURN_IF_ERROR(render(n.else_body, out));
          break;
        }
        case Node::Kind::kFor: TESSERA_RETURN_IF_ERROR(render_for(n, out)); break;
      }
    }
    return Status::ok();
  }

 private:
  Status type_error(const std::string& what, const Expr& e) {
    return invalid_argument("chat template line " + std::to_string(e.line) + ": " + what);
  }

  Status render_for(const Node& n, std::string& out) {
    TESSERA_ASSIGN_OR_RETURN(Value seq, eval(*n.expr));
    List items;
    if (seq.kind == Value::Kind::kList) {
      items = *seq.list;
    } else if (seq.kind == Value::Kind::kMap) {
      for (const auto& [k, v] : *seq.map) items.push_back(Value::of(k));
    } else if (seq.kind == Value::Kind::kString) {
      for (char c : seq.s) items.push_back(Value::of(std::string(1, c)));
    } else if (seq.kind != Value::Kind::kUndefined && seq.kind != Value::Kind::kNone) {
      return type_error("cannot loop over " + to_text(seq), *n.expr);
    }
    if (items.empty()) return render(n.else_body, out);
    // A for loop is a scope: sets inside it do not leak out (Jinja semantics).
    scopes_.emplace_back();
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      Map& scope = scopes_.back();
      if (n.names.size() == 1) {
        scope[n.names[0]] = items[k];
      } else {
        const Value& item = items[k];
        if (item.kind != Value::Kind::kList || item.list->size() != n.names.size())
          return type_error("cannot unpack " + repr(item) + " into " + std::to_string(n.names.size()) + " names", *n.expr);
        for (size_t j = 0; j < n.names.size(); ++j) scope[n.names[j]] = (*item.list)[j];
      }
      Map loop;
      loop["index0"] = Value::of(k);
      loop["index"] = Value::of(k + 1);
      loop["revindex0"] = Value::of(len - 1 - k);
      loop["revindex"] = Value::of(len - k);
      loop["first"] = Value::of(k == 0);
      loop["last"] = Value::of(k == len - 1);
      loop["length"] = Value::of(len);
      loop["previtem"] = k > 0 ? items[k - 1] : Value();
      loop["nextitem"] = k + 1 < len ? items[k + 1] : Value();
      scope["loop"] = Value::of(std::move(loop));
      Status st = render(n.body, out);
      if (!st.is_ok()) {
        scopes_.pop_back();
        return st;
      }
    }
    scopes_.pop_back();
    return Status::ok();
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  static int64_t clamp_index(int64_t k, int64_t len) {
    if (k < 0) k += len;
    return std::clamp<int64_t>(k, 0, len);
  }

  StatusOr<Value> eval(const Expr& e) {
    switch (e.op) {
      case Expr::Op::kLiteral: return e.literal;
      case Expr::Op::kVar: return lookup(e.name);
      case Expr::Op::kList: {
        List items;
        for (const auto& a : e.args) {
          TESSERA_ASSIGN_OR_RETURN(Value v, eval(*a));
          items.push_back(std::move(v));
        }
        return Value::of(std::move(items));
      }
      case Expr::Op::kAttr: {
        TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
        return member(obj, Value::of(e.name));
      }
      case Expr::Op::kIndex: {
        TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
        TESSERA_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
        return member(obj, key);
      }
      case Expr::Op::kSlice: {
        TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
        int64_t len = obj.kind == Value::Kind::kList ? static_cast<int64_t>(obj.list->size())
                      : obj.kind == Value::Kind::kString ? static_cast<int64_t>(obj.s.size()) : -1;
        if (len < 0) return type_error("cannot slice " + repr(obj), e);
        int64_t from = 0, to = len;
        if (e.args[1]) {
          TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[1]));
          if (v.kind != Value::Kind::kInt) return type_error("slice bounds must be integers", e);
          from = clamp_index(v.i, len);
        }
        if (e.args[2]) {
          TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[2]));
          if (v.kind != Value::Kind::kInt) return type_error("slice bounds must be integers", e);
          to = clamp_index(v.i, len);
        }
        to = std::max(to, from);
        if (obj.kind == Value::Kind::kString) return Value::of(obj.s.substr(from, to - from));
        return Value::of(List(obj.list->begin() + from, obj.list->begin() + to));
      }
      case Expr::Op::kNot: {
        TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        return Value::of(!truthy(v));
      }
      case Expr::Op::kNeg: {
        TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        if (v.kind != Value::Kind::kInt) return type_error("cannot negate " + repr(v), e);
        return Value::of(-v.i);
      }
      case Expr::Op::kAnd: {
        TESSERA_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
        if (!truthy(a)) return a;
        return eval(*e.args[1]);
      }
      case Expr::Op::kOr: {
        TESSERA_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
        if (truthy(a)) return a;
        return eval(*e.args[1]);
      }
      case Expr::Op::kTernary: {
        TESSERA_ASSIGN_OR_RETURN(Value c, eval(*e.args[0]));
        return eval(*e.args[truthy(c) ? 1 : 2]);
      }
      case Expr::Op::kBinary: return binary(e);
      case Expr::Op::kCall: return call(e);
      case Expr::Op::kFilter: return filter(e);
      case Expr::Op::kTest: return test(e);
    }
    return type_error("bad expression", e);
  }

  // obj.name / obj[key]: map entries, list items; a missing entry is undefined.
  StatusOr<Value> member(const Value& obj, const Value& key) {
    if (obj.kind == Value::Kind::kMap && key.kind == Value::Kind::kString) {
      auto it = obj.map->find(key.s);
      return it == obj.map->end() ? Value() : it->second;
    }
    if ((obj.kind == Value::Kind::kList || obj.kind == Value::Kind::kString) && key.kind == Value::Kind::kInt) {
      const int64_t len = obj.kind == Value::Kind::kList ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(obj.s.size());
      const int64_t k = key.i < 0 ? key.i + len : key.i;
      if (k < 0 || k >= len) return Value();
      return obj.kind == Value::Kind::kList ? (*obj.list)[k] : Value::of(obj.s.substr(k, 1));
    }
    return Value();
  }

  StatusOr<Value> binary(const Expr& e) {
    TESSERA_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
    TESSERA_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
    const std::string& op = e.name;
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "~") return Value::of(to_text(a) + to_text(b));
    if (op == "in") {
      bool found = false;
      if (b.kind == Value::Kind::kString && a.kind == Value::Kind::kString) found = b.s.find(a.s) != std::string::npos;
      else if (b.kind == Value::Kind::kList) found = std::any_of(b.list->begin(), b.list->end(), [&](const Value& x) { return equal(a, x); });
      else if (b.kind == Value::Kind::kMap && a.kind == Value::Kind::kString) found = b.map->count(a.s) > 0;
      else if (b.kind != Value::Kind::kUndefined) return type_error("'in' needs a string, list or mapping on the right", e);
      return Value::of(found != e.negate);
    }
    if (a.kind == Value::Kind::kString && b.kind == Value::Kind::kString) {
      if (op == "+") return Value::of(a.s + b.s);
      if (op == "<") return Value::of(a.s < b.s);
      if (op == ">") return Value::of(a.s > b.s);
      if (op == "<=") return Value::of(a.s <= b.s);
      if (op == ">=") return Value::of(a.s >= b.s);
    }
    if (a.kind == Value::Kind::kList && b.kind == Value::Kind::kList && op == "+") {
      List joined = *a.list;
      joined.insert(joined.end(), b.list->begin(), b.list->end());
      return Value::of(std::move(joined));
    }
    auto num = [](const Value& v, int64_t* out) {
      if (v.kind == Value::Kind::kInt) *out = v.i;
      else if (v.kind == Value::Kind::kBool) *out = v.b;
      else return false;
      return true;
    };
    int64_t x = 0, y = 0;
    if (num(a, &x) && num(b, &y)) {
      if (op == "+") return Value::of(x + y);
      if (op == "-") return Value::of(x - y);
      if (op == "*") return Value::of(x * y);
      if (op == "<") return Value::of(x < y);
      if (op == ">") return Value::of(x > y);
      if (op == "<=") return Value::of(x <= y);
      if (op == ">=") return Value::of(x >= y);
      if (op == "//" || op == "%" || op == "/") {
        if (y == 0) return type_error("division by zero", e);
        if (op == "/" && x % y != 0) return unsupported("non-integer division result", e.line);
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
          --q;
          r += y;
        }
        return Value::of(op == "%" ? r : q);
      }
    }
    if (a.kind == Value::Kind::kString && b.kind == Value::Kind::kInt && op == "*")
      return Value::of([&] { std::string s; for (int64_t k = 0; k < b.i; ++k) s += a.s; return s; }());
    return type_error("unsupported operand types for '" + op + "': " + repr(a) + " and " + repr(b), e);
  }

  StatusOr<std::vector<Value>> eval_args(const Expr& e, size_t first) {
    std::vector<Value> out;
    for (size_t k = first; k < e.args.size(); ++k) {
      TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[k]));
      out.push_back(std::move(v));
    }
    return out;
  }

  static std::string strip(const std::string& s, bool left, bool right, const std::string& chars = " \t\r\n\f\v") {
    size_t b = 0, e = s.size();
    if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
    if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
    return s.substr(b, e - b);
  }
  static std::string map_chars(std::string s, int (*f)(int)) {
    for (char& c : s) c = static_cast<char>(f(static_cast<unsigned char>(c)));
    return s;
  }

  StatusOr<Value> call(const Expr& e) {
    const Expr& callee = *e.args[0];
    TESSERA_ASSIGN_OR_RETURN(std::vector<Value> args, eval_args(e, 1));
    if (callee.op == Expr::Op::kVar) {
      if (callee.name == "raise_exception") {
        return invalid_argument("chat template: " + (args.empty() ? std::string("raise_exception") : to_text(args[0])));
      }
      if (callee.name == "range" && !args.empty() && args.size() <= 2 && args[0].kind == Value::Kind::kInt) {
        const int64_t from = args.size() == 2 ? args[0].i : 0, to = args.size() == 2 ? args[1].i : args[0].i;
        List items;
        for (int64_t k = from; k < to; ++k) items.push_back(Value::of(k));
        return Value::of(std::move(items));
      }
      return unsupported("function '" + callee.name + "()'", e.line);
    }
    if (callee.op != Expr::Op::kAttr) return unsupported("call of a non-function", e.line);
    TESSERA_ASSIGN_OR_RETURN(Value obj, eval(*callee.args[0]));
    const std::string& m = callee.name;
    if (obj.kind == Value::Kind::kString) {
      const bool has_arg = !args.empty() && args[0].kind == Value::Kind::kString;
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const std::string chars = has_arg ? args[0].s : " \t\r\n\f\v";
        return Value::of(strip(obj.s, m != "rstrip", m != "lstrip", chars));
      }
      if (m == "upper") return Value::of(map_chars(obj.s, ::toupper));
      if (m == "lower") return Value::of(map_chars(obj.s, ::tolower));
      if ((m == "startswith" || m == "endswith") && has_arg) {
        const std::string& a = args[0].s;
        const bool r = a.size() <= obj.s.size() &&
                       (m == "startswith" ? obj.s.compare(0, a.size(), a) == 0 : obj.s.compare(obj.s.size() - a.size(), a.size(), a) == 0);
        return Value::of(r);
      }
      if (m == "split" && has_arg && !args[0].s.empty()) {
        List parts;
        size_t p = 0;
        for (size_t q; (q = obj.s.find(args[0].s, p)) != std::string::npos; p = q + args[0].s.size())
          parts.push_back(Value::of(obj.s.substr(p, q - p)));
        parts.push_back(Value::of(obj.s.substr(p)));
        return Value::of(std::move(parts));
      }
    }
    if (obj.kind == Value::Kind::kMap && (m == "items" || m == "keys" || m == "values") && args.empty()) {
      List out;
      for (const auto& [k, v] : *obj.map) {
        if (m == "items") out.push_back(Value::of(List{Value::of(k), v}));
        else out.push_back(m == "keys" ? Value::of(k) : v);
      }
      return Value::of(std::move(out));
    }
    if (obj.kind == Value::Kind::kMap && m == "get" && !args.empty() && args[0].kind == Value::Kind::kString) {
      auto it = obj.map->find(args[0].s);
      return it != obj.map->end() ? it->second : args.size() > 1 ? args[1] : Value::none();
    }
    return unsupported("method '." + m + "()'", e.line);
  }

  StatusOr<Value> filter(const Expr& e) {
    TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
    TESSERA_ASSIGN_OR_RETURN(std::vector<Value> args, eval_args(e, 1));
    const std::string& f = e.name;
    if (f == "trim") return Value::of(strip(to_text(v), true, true));
    if (f == "upper") return Value::of(map_chars(to_text(v), ::toupper));
    if (f == "lower") return Value::of(map_chars(to_text(v), ::tolower));
    if (f == "string") return Value::of(to_text(v));
    if (f == "capitalize" || f == "title") {
      std::string s = map_chars(to_text(v), ::tolower);
      for (size_t k = 0; k < s.size(); ++k) {
        const bool word_start = k == 0 || (f == "title" && !std::isalpha(static_cast<unsigned char>(s[k - 1])));
        if (word_start) s[k] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[k])));
      }
      return Value::of(std::move(s));
    }
    if (f == "length" || f == "count") {
      if (v.kind == Value::Kind::kString) return Value::of(static_cast<int64_t>(v.s.size()));
      if (v.kind == Value::Kind::kList) return Value::of(static_cast<int64_t>(v.list->size()));
      if (v.kind == Value::Kind::kMap) return Value::of(static_cast<int64_t>(v.map->size()));
      return type_error("length of " + repr(v), e);
    }
    if (f == "first" || f == "last") {
      if (v.kind == Value::Kind::kList) return v.list->empty() ? Value() : (f == "first" ? v.list->front() : v.list->back());
      if (v.kind == Value::Kind::kString) return v.s.empty() ? Value() : Value::of(std::string(1, f == "first" ? v.s.front() : v.s.back()));
      return type_error(f + " of " + repr(v), e);
    }
    if (f == "default" || f == "d") {
      const bool use_default = v.kind == Value::Kind::kUndefined || (args.size() > 1 && truthy(args[1]) && !truthy(v));
      return use_default ? (args.empty() ? Value::of(std::string()) : args[0]) : v;
    }
    if (f == "join") {
      if (v.kind != Value::Kind::kList) return type_error("join of " + repr(v), e);
      const std::string sep = args.empty() ? "" : to_text(args[0]);
      std::string out;
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? sep : "") + to_text((*v.list)[k]);
      return Value::of(std::move(out));
    }
    if (f == "replace" && args.size() == 2) {
      std::string s = to_text(v);
      const std::string from = to_text(args[0]), to = to_text(args[1]);
      if (from.empty()) return Value::of(s);
      std::string out;
      size_t p = 0;
      for (size_t q; (q = s.find(from, p)) != std::string::npos; p = q + from.size()) out += s.substr(p, q - p) + to;
      return Value::of(out + s.substr(p));
    }
    return unsupported("filter '" + f + "'", e.line);
  }

  StatusOr<Value> test(const Expr& e) {
    TESSERA_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
    const std::string& t = e.name;
    bool r = false;
    if (t == "defined") r = v.kind != Value::Kind::kUndefined;
    else if (t == "undefined") r = v.kind == Value::Kind::kUndefined;
    else if (t == "none") r = v.kind == Value::Kind::kNone;
    else if (t == "string") r = v.kind == Value::Kind::kString;
    else if (t == "number" || t == "integer") r = v.kind == Value::Kind::kInt;
    else if (t == "boolean") r = v.kind == Value::Kind::kBool;
    else if (t == "mapping") r = v.kind == Value::Kind::kMap;
    else if (t == "sequence" || t == "iterable") r = v.kind == Value::Kind::kList || v.kind == Value::Kind::kString || (t == "iterable" && v.kind == Value::Kind::kMap);
    else if (t == "true") r = v.kind == Value::Kind::kBool && v.b;
    else if (t == "false") r = v.kind == Value::Kind::kBool && !v.b;
    else if (t == "even" || t == "odd") {
      if (v.kind != Value::Kind::kInt) return type_error("'" + t + "' test needs an integer", e);
      r = (v.i % 2 == 0) == (t == "even");
    } else if (t == "eq" || t == "equalto" || t == "ne") {
      TESSERA_ASSIGN_OR_RETURN(std::vector<Value> args, eval_args(e, 1));
      if (args.size() != 1) return type_error("'" + t + "' test needs one argument", e);
      r = equal(v, args[0]) == (t != "ne");
    } else {
      return unsupported("test 'is " + t + "'", e.line);
    }
    return Value::of(r != e.negate);
  }

  std::vector<Map> scopes_;
};

// The built-in fallbacks, written in the same subset.
constexpr std::string_view kLlama2Template =
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] | trim %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('llama2 chat template: roles must alternate user/assistant after an optional system message') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' }}"
    "{% if loop.first and system %}{{ '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}{% endif %}"
    "{{ message['content'] | trim }}{{ ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}";

constexpr std::string_view kChatmlTemplate =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace
}  // namespace chat

StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<chat::Piece> pieces, chat::split_template(source));
  chat::TemplateParser parser(std::move(pieces));
  auto body = std::make_shared<std::vector<chat::Node>>();
  std::string stopped;
  chat::ExprParser* unused = nullptr;
  TESSERA_RETURN_IF_ERROR(parser.block(*body, {}, &stopped, &unused));
  ChatTemplate t;
  t.source_ = std::string(source);
  t.body_ = std::move(body);
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::builtin(std::string_view name) {
  if (name == "llama2") return parse(chat::kLlama2Template);
  if (name == "chatml") return parse(chat::kChatmlTemplate);
  return invalid_argument("unknown built-in chat template '" + std::string(name) + "' (llama2, chatml)");
}

StatusOr<ChatTemplate> ChatTemplate::for_tokenizer(const Tokenizer& tokenizer, std::string_view fallback) {
  StatusOr<ChatTemplate> t = tokenizer.chat_template().empty() ? builtin(fallback) : parse(tokenizer.chat_template());
  if (!t.is_ok()) return t.status();
  std::string bos = tokenizer.bos_id() >= 0 ? tokenizer.id_to_token(tokenizer.bos_id()) : "";
  std::string eos = tokenizer.eos_id() >= 0 ? tokenizer.id_to_token(tokenizer.eos_id()) : "";
  t->set_special_tokens(std::move(bos), std::move(eos));
  return t;
}

StatusOr<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  using chat::Value;
  chat::List list;
  for (const ChatMessage& m : messages) {
    chat::Map entry;
    entry["role"] = Value::of(m.role);
    entry["content"] = Value::of(m.content);
    list.push_back(Value::of(std::move(entry)));
  }
  chat::Map globals;
  globals["messages"] = Value::of(std::move(list));
  globals["add_generation_prompt"] = Value::of(add_generation_prompt);
  globals["bos_token"] = Value::of(bos_token_);
  globals["eos_token"] = Value::of(eos_token_);
  chat::Renderer renderer(std::move(globals));
  std::string out;
  if (body_) TESSERA_RETURN_IF_ERROR(renderer.render(*body_, out));
  return out;
}

}  // namespace tessera
