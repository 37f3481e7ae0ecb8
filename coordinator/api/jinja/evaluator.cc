#include "coordinator/api/jinja/evaluator.h"

#include <cmath>

#include "coordinator/api/jinja/builtins.h"

namespace tessera::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

void fail_undefined(const Value& v) {
  fail(v.undefined_hint().empty() ? std::string("an undefined value was used") : v.undefined_hint());
}

// ---- Python operators ----

static void check_int(bool overflow) {
  if (overflow) fail("integer overflow (the result does not fit in 64 bits)");
}

static std::string repeat(const std::string& s, int64_t n, Evaluator& ev) {
  if (n <= 0 || s.empty()) return "";
  if (static_cast<uint64_t>(n) > (ev.limits().max_output_bytes / s.size()) + 1) fail("string repetition too large");
  ev.charge(s.size() * static_cast<size_t>(n));
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out += s;
  return out;
}

// printf-style `"%s and %d" % (a, b)`, as Python's str % for the common conversions.
static std::string percent_format(const std::string& fmt, const Value& args) {
  List values = args.is_tuple() ? args.items() : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    std::string spec;
    while (i < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[i])) || fmt[i] == '.' || fmt[i] == '-' ||
                              fmt[i] == '+' || fmt[i] == ' ' || fmt[i] == '0'))
      spec += fmt[i++];
    if (i >= fmt.size()) fail("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) fail("not enough arguments for format string");
    const Value& v = values[next++];
    char buf[512];
    std::string f = "%" + spec;
    switch (conv) {
      case 's': out += to_str(v); break;
      case 'r': out += repr(v); break;
      case 'd':
      case 'i':
        if (!v.is_number()) fail("%d format: a real number is required, not " + type_name(v));
        std::snprintf(buf, sizeof buf, (f + "lld").c_str(), static_cast<long long>(v.is_integer() ? v.as_int() : static_cast<int64_t>(v.as_number())));
        out += buf;
        break;
      case 'f':
      case 'e':
      case 'g':
        if (!v.is_number()) fail(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
        std::snprintf(buf, sizeof buf, (f + conv).c_str(), v.as_number());
        out += buf;
        break;
      case 'x':
        if (!v.is_integer()) fail("%x format: an integer is required, not " + type_name(v));
        std::snprintf(buf, sizeof buf, (f + "llx").c_str(), static_cast<long long>(v.as_int()));
        out += buf;
        break;
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (next < values.size()) fail("not all arguments converted during string formatting");
  return out;
}

Value binary_op(const std::string& op, const Value& a, const Value& b, Evaluator& ev) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    ev.charge(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = a.is_integer() && b.is_integer();
  int64_t r = 0;
  if (op == "+") {
    if (ints) {
      check_int(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (nums) return Value(a.as_number() + b.as_number());
    if (a.is_string() && b.is_string()) {
      ev.charge(a.as_string().size() + b.as_string().size());
      if (a.is_markup() || b.is_markup()) {  // Markup.__add__ / __radd__ escape the plain side
        const auto side = [](const Value& v) { return v.is_markup() ? v.as_string() : html_escape(v.as_string()); };
        return Value::markup(side(a) + side(b));
      }
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string() || a.is_list())
      fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
  } else if (op == "-") {
    if (ints) {
      check_int(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (nums) return Value(a.as_number() - b.as_number());
  } else if (op == "*") {
    if (ints) {
      check_int(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (nums) return Value(a.as_number() * b.as_number());
    if (a.is_string() && b.is_integer()) return Value(repeat(a.as_string(), b.as_int(), ev));
    if (b.is_string() && a.is_integer()) return Value(repeat(b.as_string(), a.as_int(), ev));
    if (a.is_list() && b.is_integer()) {
      List items;
      const int64_t n = b.as_int();
      if (n > 0 && static_cast<uint64_t>(n) * a.items().size() > 10'000'000) fail("list repetition too large");
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), a.items().begin(), a.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
  } else if (op == "/") {
    if (nums) {
      if (b.as_number() == 0) fail("division by zero");
      return Value(a.as_number() / b.as_number());
    }
  } else if (op == "//" || op == "%") {
    if (a.is_string() && op == "%") return Value(percent_format(a.as_string(), b));
    if (nums && b.as_number() == 0) fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) fail("integer overflow (the result does not fit in 64 bits)");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (nums) {
      const double x = a.as_number(), y = b.as_number();
      if (op == "//") return Value(std::floor(x / y));
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if (e & 1) check_int(__builtin_mul_overflow(result, base, &result));
        if (e > 1) check_int(__builtin_mul_overflow(base, base, &base));
      }
      return Value(result);
    }
    if (nums) {
      if (a.as_number() == 0 && b.as_number() < 0) fail("0.0 cannot be raised to a negative power");
      return Value(std::pow(a.as_number(), b.as_number()));
    }
  }
  fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.items())
        if (equals(v, item)) return true;
      return false;
    case Kind::kDict: return container.entries().find_key(item) != nullptr;
    case Kind::kNamespace: return item.is_string() && container.entries().find(item.as_string()) != nullptr;
    default: fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

static std::string object_name(const Value& obj) {
  return obj.is_none() ? "'None'" : "'" + type_name(obj) + " object'";
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind() == Kind::kDict) {
    if (Value m = method_of(obj, name); !m.is_undefined()) return m;
    if (const Value* v = obj.entries().find(name)) return *v;
  } else if (obj.kind() == Kind::kNamespace) {
    if (const Value* v = obj.entries().find(name)) return *v;
  } else if (Value m = method_of(obj, name); !m.is_undefined()) {
    return m;
  }
  return Value::undefined(object_name(obj) + " has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if ((obj.is_dict() || obj.kind() == Kind::kNamespace) && key.is_string()) {
    if (const Value* v = obj.entries().find(key.as_string())) return *v;
    if (obj.is_dict())
      if (Value m = method_of(obj, key.as_string()); !m.is_undefined()) return m;
    return Value::undefined(object_name(obj) + " has no attribute '" + key.as_string() + "'");
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.entries().find_key(key)) return *v;
    return Value::undefined(object_name(obj) + " has no element " + repr(key));
  }
  if ((obj.is_list() || obj.is_string()) && key.is_integer()) {
    const int64_t n = length(obj);
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(object_name(obj) + " has no element " + std::to_string(key.as_int()));
    if (obj.is_list()) return obj.items()[static_cast<size_t>(i)];
    return Value(slice_string(obj.as_string(), Value(i), Value(i + 1), Value::none()));
  }
  if (key.is_string()) {
    if (Value m = method_of(obj, key.as_string()); !m.is_undefined()) return m;
    return Value::undefined(object_name(obj) + " has no attribute '" + key.as_string() + "'");
  }
  return Value::undefined(object_name(obj) + " has no element " + repr(key));
}

// ---- evaluation ----

void Evaluator::step() {
  if (++steps_ > limits_.max_steps)
    fail("the template ran for more than " + std::to_string(limits_.max_steps) + " steps");
}

void Evaluator::charge(size_t bytes) {
  built_ += bytes;
  if (built_ > limits_.max_built_bytes)
    fail("the template built more than " + std::to_string(limits_.max_built_bytes) + " bytes of text");
}

void Evaluator::emit(std::string& out, const std::string& text) {
  produced_ += text.size();
  if (produced_ > limits_.max_output_bytes)
    fail("the template's output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  out += text;
}

std::string Evaluator::render(const Body& body, ScopePtr globals) {
  struct BreakCycles {
    Evaluator* ev;
    ~BreakCycles() {
      for (auto& l : ev->mutated_lists_) l->clear();
      for (auto& d : ev->mutated_dicts_) d->entries.clear();
      for (auto& s : ev->macro_scopes_) s->vars.clear();
    }
  } cleanup{this};
  std::string out;
  exec(body, out, globals);
  return out;
}

Value Evaluator::call(const Value& function, const Args& args) {
  if (function.kind() == Kind::kCallable) return function.function().fn(*this, args);
  if (function.is_undefined()) fail_undefined(function);
  fail("'" + type_name(function) + "' object is not callable");
}

Evaluator::Flow Evaluator::exec(const Body& body, std::string& out, const ScopePtr& scope) {
  for (const Stmt& s : body) {
    const Flow f = exec_one(s, out, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::exec_one(const Stmt& s, std::string& out, const ScopePtr& scope) {
  step();
  try {
    switch (s.kind) {
      case StmtKind::kText: emit(out, s.text); return Flow::kNormal;
      case StmtKind::kOutput: emit(out, to_str(eval(*s.expr, scope))); return Flow::kNormal;
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond, scope))) return exec(body, out, scope);
        return exec(s.else_body, out, scope);
      case StmtKind::kFor: return exec_for(s, out, scope);
      case StmtKind::kSet: exec_set(s, scope); return Flow::kNormal;
      case StmtKind::kSetBlock: {
        std::string text;
        auto inner = std::make_shared<Scope>(Scope{{}, scope});
        exec(s.body, text, inner);
        Value v(std::move(text));
        if (s.expr) v = apply_filter_chain(*s.expr, v, scope);
        scope->vars[s.targets[0]] = std::move(v);
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        scope->vars[s.text] = make_macro(s, scope, s.text);
        if (tracked_.insert(scope.get()).second) macro_scopes_.push_back(scope);
        return Flow::kNormal;
      case StmtKind::kCallBlock: {
        const Expr& call_expr = *s.expr;
        Value callee = eval(*call_expr.children[0], scope);
        Args args = eval_args(call_expr, 1, scope);
        args.named.emplace_back("caller", make_macro(s, scope, "caller"));
        emit(out, to_str(call(callee, args)));
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        std::string text;
        auto inner = std::make_shared<Scope>(Scope{{}, scope});
        exec(s.body, text, inner);
        emit(out, to_str(apply_filter_chain(*s.expr, Value(std::move(text)), scope)));
        return Flow::kNormal;
      }
      case StmtKind::kWith: {
        auto inner = std::make_shared<Scope>(Scope{{}, scope});
        for (size_t i = 0; i < s.targets.size(); ++i) inner->vars[s.targets[i]] = eval(*s.values[i], scope);
        return exec(s.body, out, inner);
      }
      case StmtKind::kScope: return exec(s.body, out, scope);
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
    }
  } catch (RenderError& e) {
    if (!e.located) {
      e.message = "line " + std::to_string(s.line) + ": " + e.message;
      e.located = true;
    }
    throw;
  }
  return Flow::kNormal;
}

// Binds `targets` to `value` (unpacking a sequence for `for k, v in ...` / `set a, b = ...`).
static void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& value) {
  if (targets.size() == 1) {
    scope.vars[targets[0]] = value;
    return;
  }
  List items = value.is_list() ? value.items() : iterate(value);
  if (items.size() != targets.size())
    fail(items.size() < targets.size() ? "not enough values to unpack (expected " + std::to_string(targets.size()) +
                                             ", got " + std::to_string(items.size()) + ")"
                                       : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s, std::string& out, const ScopePtr& scope) {
  const Value iterable = eval(*s.expr, scope);
  if (iterable.is_none() || iterable.is_number() || iterable.kind() == Kind::kCallable)
    fail("'" + type_name(iterable) + "' object is not iterable");
  List items = iterate(iterable);
  if (s.cond) {  // for x in xs if cond: the loop sees only the items that pass
    List kept;
    for (const Value& item : items) {
      auto probe = std::make_shared<Scope>(Scope{{}, scope});
      bind_targets(*probe, s.targets, item);
      if (truthy(eval(*s.cond, probe))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>(Scope{{}, scope});
    exec(s.else_body, out, inner);
    return Flow::kNormal;
  }
  const auto n = static_cast<int64_t>(items.size());
  auto last_changed = std::make_shared<std::optional<Value>>();
  for (int64_t i = 0; i < n; ++i) {
    step();  // an empty body still costs an iteration
    auto inner = std::make_shared<Scope>(Scope{{}, scope});
    bind_targets(*inner, s.targets, items[static_cast<size_t>(i)]);
    auto loop = std::make_shared<Dict>();
    loop->set("index", Value(i + 1));
    loop->set("index0", Value(i));
    loop->set("revindex", Value(n - i));
    loop->set("revindex0", Value(n - i - 1));
    loop->set("first", Value(i == 0));
    loop->set("last", Value(i == n - 1));
    loop->set("length", Value(n));
    loop->set("depth", Value(1));
    loop->set("depth0", Value(0));
    loop->set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop->set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop->set("cycle", Value::callable("loop.cycle", [i](Evaluator&, const Args& a) {
                if (a.positional.empty()) fail("loop.cycle() needs at least one item");
                return a.positional[static_cast<size_t>(i) % a.positional.size()];
              }));
    loop->set("changed", Value::callable("loop.changed", [last_changed](Evaluator&, const Args& a) {
                Value now = Value::list(a.positional, true);
                const bool changed = !last_changed->has_value() || !equals(**last_changed, now);
                *last_changed = now;
                return Value(changed);
              }));
    inner->vars["loop"] = Value::namespace_object(std::move(loop));
    if (exec(s.body, out, inner) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Evaluator::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value v = eval(*s.expr, scope);
  if (!s.text.empty()) {  // set ns.attr = v
    const Value* ns = scope->find(s.targets[0]);
    if (ns == nullptr || ns->kind() != Kind::kNamespace)
      fail("cannot assign attribute '" + s.text + "' on '" + s.targets[0] + "': it is not a namespace() object");
    track_mutated(ns->shared_entries());
    ns->entries().set(s.text, std::move(v));
    return;
  }
  bind_targets(*scope, s.targets, v);
}

// A macro (or a call block's `caller`): renders its body in a scope of its own whose parent
// is where it was defined, with the parameters bound as Python binds them.
Value Evaluator::make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name) {
  const Stmt* def = &s;
  return Value::callable(name, [def, scope, name](Evaluator& ev, const Args& args) {
    if (ev.call_depth_ >= ev.limits_.max_call_depth)
      fail("macro calls nested deeper than " + std::to_string(ev.limits_.max_call_depth) + " (in " + name + ")");
    auto inner = std::make_shared<Scope>(Scope{{}, scope});
    const std::vector<std::string>& params = def->targets;
    for (size_t i = 0; i < params.size(); ++i) {
      if (const Value* v = args.get(i, params[i])) {
        inner->vars[params[i]] = *v;
      } else if (def->values[i]) {
        inner->vars[params[i]] = ev.eval(*def->values[i], inner);
      } else {
        inner->vars[params[i]] = Value::undefined("'" + params[i] + "' is undefined (no argument for it in " + name + "())");
      }
    }
    List varargs(args.positional.size() > params.size() ? args.positional.begin() + static_cast<long>(params.size())
                                                        : args.positional.end(),
                 args.positional.end());
    auto kwargs = std::make_shared<Dict>();
    for (const auto& [k, v] : args.named) {
      if (k == "caller") {
        inner->vars["caller"] = v;
      } else if (std::find(params.begin(), params.end(), k) == params.end()) {
        kwargs->set(k, v);
      }
    }
    inner->vars["varargs"] = Value::list(std::move(varargs), true);
    inner->vars["kwargs"] = Value::dict(std::move(kwargs));
    std::string out;
    ++ev.call_depth_;
    try {
      ev.exec(def->body, out, inner);
    } catch (...) {
      --ev.call_depth_;
      throw;
    }
    --ev.call_depth_;
    return Value(std::move(out));
  });
}

Args Evaluator::eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
  Args args;
  for (size_t i = first; i < e.children.size(); ++i) args.positional.push_back(eval(*e.children[i], scope));
  for (const auto& [k, v] : e.kwargs) args.named.emplace_back(k, eval(*v, scope));
  return args;
}

Value Evaluator::apply_filter_chain(const Expr& f, const Value& operand, const ScopePtr& scope) {
  Value in = f.children[0] ? apply_filter_chain(*f.children[0], operand, scope) : operand;
  return apply_filter(*this, f.name, in, eval_args(f, 1, scope));
}

Value Evaluator::eval(const Expr& e, const ScopePtr& scope) {
  step();
  switch (e.kind) {
    case ExprKind::kLiteral: return e.literal;
    case ExprKind::kName: {
      if (const Value* v = scope->find(e.name)) return *v;
      if (Value g = global_function(e.name); !g.is_undefined()) return g;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      for (const auto& c : e.children) items.push_back(eval(*c, scope));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      auto d = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value k = eval(*e.children[i], scope);
        d->set_key(std::move(k), eval(*e.children[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kAttr: return get_attr(eval(*e.children[0], scope), e.name);
    case ExprKind::kItem: return get_item(eval(*e.children[0], scope), eval(*e.children[1], scope));
    case ExprKind::kSlice: {
      Value obj = eval(*e.children[0], scope);
      Value parts[3];
      for (int k = 0; k < 3; ++k) parts[k] = e.children[k + 1] ? eval(*e.children[k + 1], scope) : Value::none();
      if (obj.is_undefined()) fail_undefined(obj);
      if (obj.is_string()) return Value(slice_string(obj.as_string(), parts[0], parts[1], parts[2]));
      if (obj.is_list()) return slice_list(obj, parts[0], parts[1], parts[2]);
      fail("'" + type_name(obj) + "' object is not subscriptable");
    }
    case ExprKind::kCall: {
      Value callee = eval(*e.children[0], scope);
      return call(callee, eval_args(e, 1, scope));
    }
    case ExprKind::kFilter:
      return apply_filter(*this, e.name, eval(*e.children[0], scope), eval_args(e, 1, scope));
    case ExprKind::kTest: {
      const bool r = apply_test(*this, e.name, eval(*e.children[0], scope), eval_args(e, 1, scope));
      return Value(r != e.negated);
    }
    case ExprKind::kUnary: {
      Value v = eval(*e.children[0], scope);
      if (e.name == "not") return Value(!truthy(v));
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) fail("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.is_integer() ? Value(v.as_int()) : v;
      if (v.is_integer()) {
        if (v.as_int() == INT64_MIN) fail("integer overflow (the result does not fit in 64 bits)");
        return Value(-v.as_int());
      }
      return Value(-v.as_number());
    }
    case ExprKind::kBinary: {
      if (e.name == "and" || e.name == "or") {
        Value a = eval(*e.children[0], scope);
        if (truthy(a) == (e.name == "or")) return a;
        return eval(*e.children[1], scope);
      }
      Value a = eval(*e.children[0], scope);
      Value b = eval(*e.children[1], scope);
      return binary_op(e.name, a, b, *this);
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.children[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.children[i + 1], scope);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") r = equals(left, right);
        else if (op == "!=") r = !equals(left, right);
        else if (op == "in") r = contains(right, left);
        else if (op == "not in") r = !contains(right, left);
        else {
          const int c = compare(left, right);
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::kCondition:
      if (truthy(eval(*e.children[1], scope))) return eval(*e.children[0], scope);
      return e.children[2] ? eval(*e.children[2], scope) : Value::undefined("the condition was false and there is no else");
  }
  return Value();
}

}  // namespace tessera::jinja
