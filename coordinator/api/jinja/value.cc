#include "coordinator/api/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "coordinator/api/jinja/unicode.h"

namespace tessera::jinja {

namespace {
// Values built by a template can nest (a list put into itself through a loop); printing and
// comparing them recurse, so the depth is bounded.
constexpr int kMaxNesting = 200;
void check_depth(int depth) {
  if (depth > kMaxNesting) fail("value nested deeper than " + std::to_string(kMaxNesting) + " levels");
}
}  // namespace

void fail(std::string message) { throw RenderError{std::move(message)}; }

// Python's hashable values among a template's: the scalars and tuples of them. An undefined
// is refused too (Jinja2 would hash it, but a key nobody defined is a template's mistake).
static bool hashable(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString: return true;
    case Kind::kList:
      if (!v.is_tuple()) return false;
      for (const Value& item : v.items())
        if (!hashable(item)) return false;
      return true;
    default: return false;
  }
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

const Value* Dict::find_key(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  if (!hashable(key)) return nullptr;
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries) {
    if (k.is_string() && k.as_string() == key) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(Value(key), std::move(v));
}

void Dict::set_key(Value key, Value v) {
  if (key.is_string()) return set(key.as_string(), std::move(v));
  if (!hashable(key))
    fail(key.is_undefined() && !key.undefined_hint().empty() ? key.undefined_hint()
                                                              : "unhashable type: '" + type_name(key) + "'");
  for (auto& [k, old] : entries) {
    if (equals(k, key)) {  // Python keeps the first key object: {1: 'a', True: 'b'} is {1: 'b'}
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(v));
}

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : named)
    if (k == name) return &v;
  return nullptr;
}

void Args::check(std::string_view function, size_t max_positional, std::initializer_list<std::string_view> allowed) const {
  if (positional.size() > max_positional)
    fail(std::string(function) + "() takes at most " + std::to_string(max_positional) + " positional argument(s) (" +
         std::to_string(positional.size()) + " given)");
  for (const auto& [k, v] : named) {
    bool known = false;
    for (std::string_view a : allowed) known = known || a == k;
    if (!known) fail(std::string(function) + "() got an unexpected keyword argument '" + k + "'");
  }
}

Value Value::list(List items, bool tuple) {
  Value v(Kind::kList);
  v.list_ = std::make_shared<List>(std::move(items));
  v.tuple_ = tuple;
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v(Kind::kDict);
  v.dict_ = d ? std::move(d) : std::make_shared<Dict>();
  return v;
}

Value Value::namespace_object(std::shared_ptr<Dict> d) {
  Value v(Kind::kNamespace);
  v.dict_ = d ? std::move(d) : std::make_shared<Dict>();
  return v;
}

Value Value::callable(std::string name, std::function<Value(Evaluator&, const Args&)> fn) {
  Value v(Kind::kCallable);
  v.fn_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return v.is_tuple() ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return v.as_int() != 0;
    case Kind::kFloat: return v.as_number() != 0.0;
    case Kind::kString: return !v.as_string().empty();
    case Kind::kList: return !v.items().empty();
    case Kind::kDict: return !v.entries().entries.empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that round-trip (as Python's repr), then Python's layout: fixed
  // notation for exponents -4..15, else d.ddde+XX.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char expbuf[16];
  std::snprintf(expbuf, sizeof expbuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + expbuf;
}

static std::string repr_string(const std::string& s) {
  // Python: single quotes unless the text has a ' and no ".
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

static std::string repr_at(const Value& v, int depth);

static std::string str_at(const Value& v, int depth) {
  switch (v.kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: return format_float(v.as_number());
    case Kind::kString: return v.as_string();
    default: return repr_at(v, depth);
  }
}

static std::string repr_at(const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind()) {
    case Kind::kString: return repr_string(v.as_string());
    case Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      const List& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += repr_at(items[i], depth + 1);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.entries().entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_at(k, depth + 1) + ": " + repr_at(item, depth + 1);
      }
      return out + "}";
    }
    case Kind::kNamespace: return "<Namespace>";
    case Kind::kCallable: return "<function " + v.function().name + ">";
    default: return str_at(v, depth);
  }
}

std::string to_str(const Value& v) { return str_at(v, 0); }
std::string repr(const Value& v) { return repr_at(v, 0); }

static bool equals_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integer() && b.is_integer()) return a.as_int() == b.as_int();
    return a.as_number() == b.as_number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equals_at(a.items()[i], b.items()[i], depth + 1)) return false;
      return true;
    }
    case Kind::kDict: {
      const auto& x = a.entries().entries;
      if (x.size() != b.entries().entries.size()) return false;
      for (const auto& [k, item] : x) {
        const Value* other = b.entries().find_key(k);
        if (other == nullptr || !equals_at(item, *other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return &a.entries() == &b.entries();
    case Kind::kCallable: return &a.function() == &b.function();
    default: return false;
  }
}

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }

static int compare_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integer() && b.is_integer()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is how Python compares str.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals_at(x[i], y[i], depth + 1)) continue;
      return compare_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined())
    fail(a.is_undefined() && !a.undefined_hint().empty() ? a.undefined_hint()
         : !b.undefined_hint().empty()                     ? b.undefined_hint()
                                                           : "an undefined value cannot be compared");
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

int compare(const Value& a, const Value& b) { return compare_at(a, b, 0); }

List iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};  // Jinja2's Undefined iterates as empty
    case Kind::kList: return v.items();
    case Kind::kDict: {
      List keys;
      for (const auto& [k, item] : v.entries().entries) keys.emplace_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (char32_t c : utf8_decode(v.as_string())) {
        std::string s;
        utf8_append(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Kind::kList: return static_cast<int64_t>(v.items().size());
    case Kind::kDict:
    case Kind::kNamespace: return static_cast<int64_t>(v.entries().entries.size());
    default: fail("object of type '" + type_name(v) + "' has no len()");
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(j.get<uint64_t>()))
                                                                   : Value(j.get<double>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(it.key(), from_json(it.value()));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {  // a surrogate pair, as json.dumps writes astral characters
            const char32_t u = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          utf8_append(out, c);
        }
      }
    }
  }
  out += '"';
}

static void json_value(std::string& out, const Value& v, const JsonOptions& o, int depth);

// A dict key as json.dumps writes it: a string as itself, None / bool / int / float as their
// JSON text put in quotes ({1: 'a'} is {"1": "a"}); a tuple is Python's TypeError.
static void json_key(std::string& out, const Value& key, const JsonOptions& o) {
  if (key.is_string()) return json_string(out, key.as_string(), o.ensure_ascii);
  if (key.is_list()) fail("keys must be str, int, float, bool or None, not " + type_name(key));
  std::string text;
  json_value(text, key, o, 0);
  json_string(out, text, o.ensure_ascii);
}

static void json_value(std::string& out, const Value& v, const JsonOptions& o, int depth) {
  check_depth(depth);
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator : o.indent >= 0 ? "," : ", ";
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent) * static_cast<size_t>(level), ' ');
  };
  switch (v.kind()) {
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.as_int()); return;
    case Kind::kFloat: {
      const double d = v.as_number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : format_float(d);
      return;
    }
    case Kind::kString: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Kind::kList: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_value(out, v.items()[i], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      auto entries = v.entries().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return compare(a.first, b.first) < 0; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_key(out, entries[i].first, o);
        out += key_sep;
        json_value(out, entries[i].second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Kind::kUndefined:
      fail(!v.undefined_hint().empty() ? v.undefined_hint() : "Object of type Undefined is not JSON serializable");
    case Kind::kCallable: fail("Object of type function is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

}  // namespace tessera::jinja
