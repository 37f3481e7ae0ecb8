#pragma once
// The values a template computes with, modelled on the Python objects Jinja2 templates see:
// undefined (Jinja2's default Undefined), None, bool, int, float, str (UTF-8, indexed by code
// point), list / tuple (shared, so `append` is seen by every reference, as in Python), dict
// (insertion-ordered; keys str, int, float, bool, None or tuples of them, matched as Python
// matches them: 1, 1.0 and True are one key), namespace() objects and callables (macros, built-ins,
// bound methods). str()/repr()/==/< follow Python's rules for these types. A string may be
// markupsafe's Markup (what |safe and |escape return): concatenating it with a plain string
// escapes the plain one, as Jinja2 does even with autoescape off; every other operation
// treats it as the str it is.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::jinja {

// A template error at render time (raise_exception(), a type error, an undefined value used
// where Jinja2 raises). The engine throws it internally; Template::render turns it into a
// Status, so it never leaves the engine.
struct RenderError {
  std::string message;
  bool located = false;  // the message already says where (or is the template's own, verbatim)
};
[[noreturn]] void fail(std::string message);

class Value;
class Evaluator;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<Value, Value>> entries;  // insertion order, as Python dicts
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
  // Any key, as a dict literal or dict() gives them: find_key finds nothing for an unhashable
  // key, set_key fails on one as Python does (a list, a dict).
  const Value* find_key(const Value& key) const;
  void set_key(Value key, Value v);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // The argument at `index` or named `name` (Python's binding of one parameter); null if
  // neither was given.
  const Value* get(size_t index, std::string_view name) const;
  // Refuses keyword arguments not in `allowed` and more than `max_positional` positionals.
  void check(std::string_view function, size_t max_positional, std::initializer_list<std::string_view> allowed) const;
};

struct Callable {
  std::string name;
  std::function<Value(Evaluator&, const Args&)> fn;
};

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined(std::string hint = "") {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value none() { return Value(Kind::kNone); }
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}  // NOLINT(implicit)
  Value(int v) : kind_(Kind::kInt), int_(v) {}    // NOLINT(implicit)
  Value(int64_t v) : kind_(Kind::kInt), int_(v) {}  // NOLINT(implicit)
  Value(double v) : kind_(Kind::kFloat), float_(v) {}  // NOLINT(implicit)
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}  // NOLINT(implicit)
  Value(const char* s) : kind_(Kind::kString), str_(s) {}  // NOLINT(implicit)
  static Value list(List items = {}, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d = nullptr);
  static Value namespace_object(std::shared_ptr<Dict> d);
  static Value callable(std::string name, std::function<Value(Evaluator&, const Args&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_integer() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // for kInt and kBool
  double as_number() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }
  const std::string& undefined_hint() const { return str_; }
  List& items() const { return *list_; }
  Dict& entries() const { return *dict_; }
  const std::shared_ptr<List>& shared_items() const { return list_; }
  const std::shared_ptr<Dict>& shared_entries() const { return dict_; }
  const Callable& function() const { return *fn_; }

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool markup_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// Python's name for the type ("str", "NoneType", "dict", ...), for error messages.
std::string type_name(const Value& v);
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); an undefined is ""
std::string repr(const Value& v);    // repr(v), as Python prints a list's items
std::string format_float(double d);  // repr(float): "1.0", "0.1", "1e-05"
bool equals(const Value& a, const Value& b);
// a < b as Python orders these types (numbers, strings, sequences); a type error otherwise.
int compare(const Value& a, const Value& b);
// Items a for loop visits: a list's items, a dict's keys, a string's characters.
List iterate(const Value& v);
// len(v); a type error for values without one.
int64_t length(const Value& v);

// JSON as Python's json.loads gives it (objects keep their key order: ordered_json).
Value from_json(const nlohmann::ordered_json& j);
struct JsonOptions {
  int indent = -1;  // < 0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_separator, key_separator;  // "" = json.dumps' defaults for the indent
};
// json.dumps(v, ...) as transformers' tojson filter calls it.
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace tessera::jinja
