#include "coordinator/api/jinja/parser.h"

#include <charconv>
#include <set>
#include <vector>

#include "coordinator/api/jinja/builtins.h"

namespace tessera::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  // ---- tokens ----
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kOperator && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kName && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& tok) {
    switch (tok.type) {
      case TokenType::kVariableEnd: return "'}}'";
      case TokenType::kBlockEnd: return "'%}'";
      case TokenType::kEnd: return "the end of the template";
      case TokenType::kString: return "a string";
      case TokenType::kText: return "text";
      default: return "'" + tok.text + "'";
    }
  }
  [[noreturn]] void error(const std::string& what, int line = -1) const {
    throw ParseError{StatusCode::kInvalidArgument, "line " + std::to_string(line < 0 ? peek().line : line) + ": " + what};
  }
  [[noreturn]] void unsupported(const std::string& what, int line) const {
    throw ParseError{StatusCode::kUnimplemented, "line " + std::to_string(line) + ": " + what};
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(std::string("expected '") + op + "', got " + describe(peek()));
  }
  std::string expect_name(const char* what) {
    if (peek().type != TokenType::kName) error(std::string("expected ") + what + ", got " + describe(peek()));
    return next().text;
  }
  void expect_block_end(const std::string& tag) {
    if (peek().type != TokenType::kBlockEnd) error("unexpected " + describe(peek()) + " in {% " + tag + " %}");
    next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxParseDepth)
        p_->error("nested deeper than " + std::to_string(kMaxParseDepth) + " levels (blocks or expressions)");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  // ---- statements ----
  // Parses until one of `ends` ({% name %}) opens a tag; leaves it consumed up to its name and
  // stores the name in *end. With no `ends`, parses to the end of the template.
  Body parse_body(const std::set<std::string>& ends, std::string* end) {
    DepthGuard guard(this);
    Body body;
    const int start_line = i_ > 0 ? t_[i_ - 1].line : 1;  // the opening tag's end
    while (true) {
      const Token& tok = peek();
      if (tok.type == TokenType::kEnd) {
        if (ends.empty()) return body;
        std::string closing = *ends.begin();
        for (const std::string& e : ends)
          if (e.rfind("end", 0) == 0) closing = e;
        error("unexpected end of template: expected {% " + closing + " %} for the block opened on line " +
              std::to_string(start_line));
      }
      if (tok.type == TokenType::kText) {
        Stmt s{StmtKind::kText, tok.line};
        s.text = tok.text;
        body.push_back(std::move(s));
        next();
        continue;
      }
      if (tok.type == TokenType::kVariableBegin) {
        next();
        Stmt s{StmtKind::kOutput, tok.line};
        s.expr = parse_tuple(true);
        if (peek().type != TokenType::kVariableEnd) error("unexpected " + describe(peek()) + " in {{ ... }}");
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (tok.type != TokenType::kBlockBegin) error("unexpected " + describe(tok));
      next();
      if (peek().type != TokenType::kName) error("expected a tag name after '{%', got " + describe(peek()));
      const std::string name = peek().text;
      if (ends.count(name)) {
        next();
        *end = name;
        return body;
      }
      body.push_back(parse_statement());
    }
  }

  Stmt parse_statement() {
    const Token& tok = next();
    const std::string& tag = tok.text;
    const int line = tok.line;
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "with") return parse_with(line);
    if (tag == "generation") {
      Stmt s{StmtKind::kScope, line};
      expect_block_end(tag);
      std::string end;
      s.body = parse_body({"endgeneration"}, &end);
      expect_block_end(end);
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error("{% " + tag + " %} outside a for loop", line);
      expect_block_end(tag);
      return Stmt{tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line};
    }
    if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "block")
      unsupported("{% " + tag + " %} is not supported: a chat template is rendered on its own, without other templates",
                  line);
    if (tag == "do") error("unknown tag 'do' (transformers does not enable Jinja2's do extension)", line);
    if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else") error("unexpected {% " + tag + " %}", line);
    error("unknown tag '" + tag + "'", line);
  }

  Stmt parse_if(int line) {
    Stmt s{StmtKind::kIf, line};
    std::string end = "if";
    while (true) {
      ExprPtr cond = parse_expression(true);
      expect_block_end(end);
      Body body = parse_body({"elif", "else", "endif"}, &end);
      s.branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        expect_block_end(end);
        s.else_body = parse_body({"endif"}, &end);
      }
      expect_block_end(end);
      return s;
    }
  }

  std::vector<std::string> parse_targets(const char* tag) {
    std::vector<std::string> names;
    const bool paren = accept_op("(");
    do {
      names.push_back(expect_name((std::string("a variable name in {% ") + tag + " %}").c_str()));
    } while (accept_op(","));
    if (paren) expect_op(")");
    return names;
  }

  Stmt parse_for(int line) {
    Stmt s{StmtKind::kFor, line};
    s.targets = parse_targets("for");
    if (!accept_name("in")) error("expected 'in' in {% for %}, got " + describe(peek()));
    s.expr = parse_tuple(false);
    if (accept_name("if")) s.cond = parse_expression(true);
    if (is_name("recursive")) unsupported("recursive for loops are not supported", line);
    expect_block_end("for");
    ++loop_depth_;
    std::string end;
    s.body = parse_body({"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end(end);
      s.else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end(end);
    return s;
  }

  Stmt parse_set(int line) {
    Stmt s{StmtKind::kSet, line};
    if (peek().type == TokenType::kName && is_op(".", 1)) {
      s.targets.push_back(next().text);
      next();
      s.text = expect_name("an attribute name in {% set %}");
    } else {
      s.targets = parse_targets("set");
    }
    if (accept_op("=")) {
      s.expr = parse_tuple(true);
      expect_block_end("set");
      return s;
    }
    if (!s.text.empty() || s.targets.size() != 1) error("expected '=' in {% set %}");
    s.kind = StmtKind::kSetBlock;
    if (is_op("|")) s.expr = parse_filters(nullptr);
    expect_block_end("set");
    std::string end;
    s.body = parse_body({"endset"}, &end);
    expect_block_end(end);
    return s;
  }

  // (name, name=default, ...) for macros and call blocks.
  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.targets.empty()) expect_op(",");
      if (is_op(")")) break;
      s.targets.push_back(expect_name("a parameter name"));
      s.values.push_back(accept_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
  }

  Stmt parse_macro(int line) {
    Stmt s{StmtKind::kMacro, line};
    s.text = expect_name("a macro name");
    parse_params(s);
    expect_block_end("macro");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s.body = parse_body({"endmacro"}, &end);
    loop_depth_ = saved;
    if (peek().type == TokenType::kName) next();  // {% endmacro name %}
    expect_block_end(end);
    return s;
  }

  Stmt parse_call_block(int line) {
    Stmt s{StmtKind::kCallBlock, line};
    if (is_op("(")) parse_params(s);
    s.expr = parse_expression(true);
    if (s.expr->kind != ExprKind::kCall) error("{% call %} expects a macro call", line);
    expect_block_end("call");
    std::string end;
    s.body = parse_body({"endcall"}, &end);
    expect_block_end(end);
    return s;
  }

  Stmt parse_filter_block(int line) {
    Stmt s{StmtKind::kFilterBlock, line};
    s.expr = parse_filter_chain(nullptr);
    expect_block_end("filter");
    std::string end;
    s.body = parse_body({"endfilter"}, &end);
    expect_block_end(end);
    return s;
  }

  Stmt parse_with(int line) {
    Stmt s{StmtKind::kWith, line};
    while (peek().type != TokenType::kBlockEnd) {
      if (!s.targets.empty()) expect_op(",");
      s.targets.push_back(expect_name("a variable name in {% with %}"));
      expect_op("=");
      s.values.push_back(parse_expression(true));
    }
    expect_block_end("with");
    std::string end;
    s.body = parse_body({"endwith"}, &end);
    expect_block_end(end);
    return s;
  }

  // ---- expressions ----
  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // a, b, c (a tuple) or one expression.
  ExprPtr parse_tuple(bool with_condition) {
    const int line = peek().line;
    ExprPtr first = parse_expression(with_condition);
    if (!is_op(",")) return first;
    ExprPtr t = node(ExprKind::kTuple, line);
    t->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().type == TokenType::kVariableEnd || peek().type == TokenType::kBlockEnd || is_op(")")) break;
      t->children.push_back(parse_expression(with_condition));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_condition) {
    DepthGuard guard(this);
    ExprPtr e = parse_or();
    if (!with_condition) return e;
    while (is_name("if")) {
      const int line = next().line;
      ExprPtr c = node(ExprKind::kCondition, line);
      c->children.push_back(std::move(e));
      c->children.push_back(parse_or());
      c->children.push_back(accept_name("else") ? parse_expression(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const char* op, ExprPtr a, ExprPtr b, int line) {
    ExprPtr e = node(ExprKind::kBinary, line);
    e->name = op;
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  // The left-associative binary operators, one level per precedence, loosest first, as
  // Jinja2's parser has them. Between `and` and `+ -` sit `not` and the comparisons
  // (parse_not, parse_compare); `**`'s operands are unary expressions with their filters.
  enum BinaryLevel { kOr, kAnd, kAddSub, kConcat, kMulDiv, kPow };
  struct BinaryOps {
    bool keyword;                   // `or`/`and` are names, the rest operator tokens
    std::vector<const char*> ops;
  };
  static const BinaryOps& binary_ops(int level) {
    static const BinaryOps kLevels[] = {
        {true, {"or"}},                   // kOr
        {true, {"and"}},                  // kAnd
        {false, {"+", "-"}},              // kAddSub
        {false, {"~"}},                   // kConcat
        {false, {"*", "/", "//", "%"}},  // kMulDiv
        {false, {"**"}},                  // kPow
    };
    return kLevels[level];
  }

  // The operator of `level` the next token is, or null.
  const char* binary_op_at(int level) const {
    const BinaryOps& level_ops = binary_ops(level);
    for (const char* op : level_ops.ops)
      if (level_ops.keyword ? is_name(op) : is_op(op)) return op;
    return nullptr;
  }

  ExprPtr parse_binary(int level) {
    auto operand = [&]() -> ExprPtr {
      if (level == kAnd) return parse_not();
      if (level == kPow) return parse_unary(true);
      return parse_binary(level + 1);
    };
    ExprPtr e = operand();
    while (const char* op = binary_op_at(level)) {
      const int line = next().line;
      e = binary(op, std::move(e), operand(), line);
    }
    return e;
  }

  ExprPtr parse_or() { return parse_binary(kOr); }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      ExprPtr e = node(ExprKind::kUnary, next().line);
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_binary(kAddSub);
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().type == TokenType::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::kCompare, line);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_binary(kAddSub));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      e = node(ExprKind::kUnary, op.line);
      e->name = op.text;
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    if (tok.type == TokenType::kName) {
      next();
      if (tok.text == "true" || tok.text == "True" || tok.text == "false" || tok.text == "False") {
        ExprPtr e = node(ExprKind::kLiteral, tok.line);
        e->literal = Value(tok.text == "true" || tok.text == "True");
        return e;
      }
      if (tok.text == "none" || tok.text == "None") {
        ExprPtr e = node(ExprKind::kLiteral, tok.line);
        e->literal = Value::none();
        return e;
      }
      ExprPtr e = node(ExprKind::kName, tok.line);
      e->name = tok.text;
      return e;
    }
    if (tok.type == TokenType::kString) {
      std::string s;
      const int line = tok.line;
      while (peek().type == TokenType::kString) s += next().text;  // "a" "b" is "ab"
      ExprPtr e = node(ExprKind::kLiteral, line);
      e->literal = Value(std::move(s));
      return e;
    }
    if (tok.type == TokenType::kInt || tok.type == TokenType::kFloat) {
      next();
      ExprPtr e = node(ExprKind::kLiteral, tok.line);
      if (tok.type == TokenType::kInt) {
        int64_t v = 0;
        auto [p, ec] = std::from_chars(tok.text.data(), tok.text.data() + tok.text.size(), v);
        if (ec != std::errc()) error("integer literal " + tok.text + " is out of range", tok.line);
        e->literal = Value(v);
      } else {
        e->literal = Value(std::strtod(tok.text.c_str(), nullptr));  // 1e999 is inf, as in Python
      }
      return e;
    }
    if (is_op("(")) {
      const int line = next().line;
      if (accept_op(")")) return node(ExprKind::kTuple, line);
      ExprPtr first = parse_expression(true);
      if (accept_op(")")) return first;
      ExprPtr t = node(ExprKind::kTuple, line);
      t->children.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        t->children.push_back(parse_expression(true));
      }
      expect_op(")");
      return t;
    }
    if (is_op("[")) {
      ExprPtr l = node(ExprKind::kList, next().line);
      while (!is_op("]")) {
        if (!l->children.empty()) expect_op(",");
        if (is_op("]")) break;
        l->children.push_back(parse_expression(true));
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ExprPtr d = node(ExprKind::kDict, next().line);
      while (!is_op("}")) {
        if (!d->children.empty()) expect_op(",");
        if (is_op("}")) break;
        d->children.push_back(parse_expression(true));
        expect_op(":");
        d->children.push_back(parse_expression(true));
      }
      expect_op("}");
      return d;
    }
    error("unexpected " + describe(tok) + " in an expression");
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) unsupported("*args and **kwargs in calls are not supported", peek().line);
      if (peek().type == TokenType::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!call.kwargs.empty()) error("a positional argument follows keyword arguments");
        call.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        ExprPtr a;
        if (peek().type == TokenType::kInt) {
          a = node(ExprKind::kItem, line);
          a->children.push_back(std::move(e));
          ExprPtr idx = node(ExprKind::kLiteral, line);
          const std::string& digits = next().text;
          int64_t index = 0;
          if (std::from_chars(digits.data(), digits.data() + digits.size(), index).ec != std::errc())
            error("index ." + digits + " is out of range", line);
          idx->literal = Value(index);
          a->children.push_back(std::move(idx));
        } else {
          a = node(ExprKind::kAttr, line);
          a->name = expect_name("an attribute name after '.'");
          a->children.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        const int line = next().line;
        ExprPtr start, stop, step;
        bool slice = false;
        if (!is_op(":")) start = parse_expression(true);
        if (accept_op(":")) {
          slice = true;
          if (!is_op("]") && !is_op(":")) stop = parse_expression(true);
          if (accept_op(":") && !is_op("]")) step = parse_expression(true);
        }
        expect_op("]");
        ExprPtr a = node(slice ? ExprKind::kSlice : ExprKind::kItem, line);
        a->children.push_back(std::move(e));
        a->children.push_back(std::move(start));
        if (slice) {
          a->children.push_back(std::move(stop));
          a->children.push_back(std::move(step));
        }
        e = std::move(a);
      } else if (is_op("(")) {
        ExprPtr c = node(ExprKind::kCall, peek().line);
        c->children.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // `| name(args) | ...` applied to e (null in a filter block), with `is` tests between.
  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter_chain(std::move(e), true);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(") && e && e->kind == ExprKind::kFilter) {
        ExprPtr c = node(ExprKind::kCall, peek().line);
        c->children.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // One filter (when `single`) or a chain `a | b(x) | c` (a {% filter %} block's).
  ExprPtr parse_filter_chain(ExprPtr operand, bool single = false) {
    while (true) {
      const int line = peek().line;
      std::string name = expect_name("a filter name");
      while (is_op(".") && peek(1).type == TokenType::kName) {
        next();
        name += "." + next().text;
      }
      ExprPtr f = node(ExprKind::kFilter, line);  // an unknown name: NameChecker below
      f->name = name;
      f->children.push_back(std::move(operand));
      if (is_op("(")) parse_call_args(*f);
      operand = std::move(f);
      if (single || !accept_op("|")) return operand;
    }
  }

  ExprPtr parse_test(ExprPtr e) {
    const int line = next().line;  // "is"
    ExprPtr t = node(ExprKind::kTest, line);
    t->negated = accept_name("not");
    std::string name = expect_name("a test name after 'is'");
    t->name = name;  // an unknown name: NameChecker below
    t->children.push_back(std::move(e));
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((peek().type == TokenType::kName && !is_name("else") && !is_name("or") && !is_name("and") &&
                !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not")) ||
               peek().type == TokenType::kString || peek().type == TokenType::kInt ||
               peek().type == TokenType::kFloat || is_op("[") || is_op("{") || is_op("-")) {
      // `is divisibleby 3`, `is sameas none`: one argument without parentheses.
      t->children.push_back(parse_postfix(parse_primary_or_negative()));
    }
    return t;
  }

  ExprPtr parse_primary_or_negative() {
    if (is_op("-")) {
      ExprPtr e = node(ExprKind::kUnary, next().line);
      e->name = "-";
      e->children.push_back(parse_primary());
      return e;
    }
    return parse_primary();
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// Jinja2 refuses a filter or test it does not know when it compiles the template, except
// inside an {% if %} (its tests and all its branches) or a conditional expression, where the
// name is looked up only if the filter runs (the evaluator then fails naming it): templates
// keep filters of other engines (llama.cpp's from_json) in branches that never run here. Loop,
// macro, call, filter, set and with blocks are frames of their own there, strict again.
class NameChecker {
 public:
  void check(const Body& body, bool soft) {
    for (const Stmt& s : body) check(s, soft);
  }

 private:
  void check(const Stmt& s, bool soft) {
    switch (s.kind) {
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches) {
          check(cond.get(), true);
          check(body, true);
        }
        check(s.else_body, true);
        return;
      case StmtKind::kFor:
        check(s.expr.get(), soft);
        check(s.cond.get(), false);
        check(s.body, false);
        check(s.else_body, false);
        return;
      case StmtKind::kWith:
        for (const ExprPtr& v : s.values) check(v.get(), soft);
        check(s.body, false);
        return;
      case StmtKind::kCallBlock:
        check(s.expr.get(), soft);
        for (const ExprPtr& v : s.values) check(v.get(), false);
        check(s.body, false);
        return;
      case StmtKind::kOutput:
      case StmtKind::kSet:
        check(s.expr.get(), soft);
        return;
      default:  // macro, set block, filter block, generation: frames of their own
        check(s.expr.get(), false);
        for (const ExprPtr& v : s.values) check(v.get(), false);
        check(s.body, false);
        return;
    }
  }

  void check(const Expr* e, bool soft) {
    if (e == nullptr) return;
    if (e->kind == ExprKind::kCondition) soft = true;
    if (!soft && e->kind == ExprKind::kFilter && !is_filter(e->name)) fail("filter", *e);
    if (!soft && e->kind == ExprKind::kTest && !is_test(e->name)) fail("test", *e);
    for (const ExprPtr& c : e->children) check(c.get(), soft);
    for (const auto& [name, value] : e->kwargs) check(value.get(), soft);
  }

  [[noreturn]] static void fail(const char* what, const Expr& e) {
    throw ParseError{StatusCode::kUnimplemented,
                     "line " + std::to_string(e.line) + ": no " + what + " named '" + e.name + "'"};
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  Body body = Parser(tokens).parse_template();
  NameChecker().check(body, false);
  return body;
}

}  // namespace tessera::jinja
