// Jinja2's built-in tests (`x is defined`, `x is divisibleby 3`) and the global functions
// templates call: range, namespace, dict, joiner, and transformers' raise_exception and
// strftime_now.
#include <algorithm>
#include <ctime>

#include "coordinator/api/jinja/builtins.h"
#include "coordinator/api/jinja/evaluator.h"
#include "coordinator/api/jinja/unicode.h"

namespace tessera::jinja {
namespace {

constexpr const char* kTests[] = {"defined",  "undefined", "none",     "boolean", "false",   "true",       "integer",
                                  "float",    "number",    "string",   "mapping", "iterable", "sequence",  "callable",
                                  "sameas",   "eq",        "equalto",  "==",      "ne",       "!=",        "lt",
                                  "lessthan", "<",         "le",       "<=",      "gt",       "greaterthan", ">",
                                  "ge",       ">=",        "in",       "odd",     "even",     "divisibleby", "lower",
                                  "upper",    "escaped"};

const Value& only_arg(const Args& a, std::string_view test) {
  if (a.positional.empty()) fail("the '" + std::string(test) + "' test needs an argument");
  return a.positional[0];
}

int64_t integer_operand(const Value& v, std::string_view test) {
  if (!v.is_integer()) fail("the '" + std::string(test) + "' test needs an integer, got " + type_name(v));
  return v.as_int();
}

std::tm now_tm(const Evaluator& ev) {
  if (ev.limits().fixed_now) return *ev.limits().fixed_now;
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

}  // namespace

bool is_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

bool apply_test(Evaluator&, std::string_view name, const Value& v, const Args& a) {
  // Unknown names reach here only from a branch Jinja2 compiles lazily (parser.cc).
  if (!is_test(name)) fail("no test named '" + std::string(name) + "'");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "true") return v.kind() == Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Kind::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.kind() == Kind::kCallable;
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && to_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && to_upper(v.as_string()) == v.as_string();
  if (name == "odd" || name == "even") return (integer_operand(v, name) % 2 != 0) == (name == "odd");
  if (name == "divisibleby") {
    const int64_t d = integer_operand(only_arg(a, name), name);
    if (d == 0) fail("integer division or modulo by zero");
    return integer_operand(v, name) % d == 0;
  }
  const Value& other = only_arg(a, name);
  if (name == "sameas") {
    if (v.kind() != other.kind()) return false;
    if (v.is_none() || v.kind() == Kind::kBool) return equals(v, other);
    if (v.is_list()) return &v.items() == &other.items();
    if (v.is_dict() || v.kind() == Kind::kNamespace) return &v.entries() == &other.entries();
    return equals(v, other);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  if (name == "in") return contains(other, v);
  const int c = compare(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
  return c >= 0;  // ge, >=
}

Value global_function(std::string_view name) {
  if (name == "range") {
    return Value::callable("range", [](Evaluator&, const Args& a) {
      if (!a.named.empty() || a.positional.empty() || a.positional.size() > 3) fail("range() takes 1 to 3 integer arguments");
      for (const Value& v : a.positional)
        if (!v.is_integer()) fail("'" + type_name(v) + "' object cannot be interpreted as an integer");
      int64_t start = 0, stop, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3) step = a.positional[2].as_int();
      }
      if (step == 0) fail("range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 1'000'000) fail("range() longer than 1000000 items");
        out.emplace_back(i);
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::callable(std::string(name), [ns](Evaluator&, const Args& a) {
      auto d = std::make_shared<Dict>();
      for (const Value& p : a.positional) {  // namespace({...}) / dict({...}) copies a mapping
        if (!p.is_dict()) fail(std::string(ns ? "namespace" : "dict") + "() positional argument must be a mapping");
        for (const auto& [k, v] : p.entries().entries) d->set_key(k, v);
      }
      for (const auto& [k, v] : a.named) d->set(k, v);
      return ns ? Value::namespace_object(std::move(d)) : Value::dict(std::move(d));
    });
  }
  if (name == "joiner") {
    return Value::callable("joiner", [](Evaluator&, const Args& a) {
      const std::string sep = a.get(0, "sep") ? to_str(*a.get(0, "sep")) : ", ";
      auto used = std::make_shared<bool>(false);
      return Value::callable("joiner", [sep, used](Evaluator&, const Args&) {
        if (!*used) {
          *used = true;
          return Value("");
        }
        return Value(sep);
      });
    });
  }
  if (name == "raise_exception") {
    return Value::callable("raise_exception", [](Evaluator&, const Args& a) -> Value {
      // The template's own words, as transformers' TemplateError carries them.
      throw RenderError{a.positional.empty() ? std::string("raise_exception() called") : to_str(a.positional[0]), true};
    });
  }
  if (name == "strftime_now") {
    return Value::callable("strftime_now", [](Evaluator& ev, const Args& a) {
      if (a.positional.size() != 1 || !a.positional[0].is_string()) fail("strftime_now() takes one format string");
      const std::tm tm = now_tm(ev);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof buf, a.positional[0].as_string().c_str(), &tm);
      if (n == 0 && !a.positional[0].as_string().empty()) fail("strftime_now(): the formatted date is too long");
      return Value(std::string(buf, n));
    });
  }
  return Value();
}

}  // namespace tessera::jinja
