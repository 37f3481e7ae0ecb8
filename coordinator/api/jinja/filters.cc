// Jinja2's built-in filters, with the arguments (positional or keyword) Jinja2 takes.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "coordinator/api/jinja/builtins.h"
#include "coordinator/api/jinja/evaluator.h"
#include "coordinator/api/jinja/unicode.h"

namespace tessera::jinja {
namespace {

const Value kNone = Value::none();

// Returned by value: the default is often a temporary.
Value arg(const Args& a, size_t i, std::string_view name, const Value& dflt) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

bool bool_arg(const Args& a, size_t i, std::string_view name, bool dflt) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : dflt;
}

// Jinja2's attribute getter: "a.b.0" looks up a, then b, then item 0 (integers as indices).
Value attribute_path(const Value& item, const Value& path) {
  if (path.is_integer()) return get_item(item, path);
  if (!path.is_string()) fail("attribute must be a string or an integer, not " + type_name(path));
  Value v = item;
  const std::string& p = path.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    v = digits ? get_item(v, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Sort/unique key: strings lower-cased unless case_sensitive (Jinja2's ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(to_lower(v.as_string()));
  return v;
}

Value key_of(const Value& item, const Value& attribute, bool case_sensitive) {
  return sort_key(attribute.is_none() ? item : attribute_path(item, attribute), case_sensitive);
}

// The leading part of `s` Python's int()/float() accept, after stripping whitespace.
std::optional<int64_t> parse_int(const std::string& text, int base) {
  std::string s = python_strip(text, nullptr, true, true);
  std::string digits;
  for (char c : s)
    if (c != '_') digits += c;
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno != 0 || end == digits.c_str() || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> parse_float(const std::string& text) {
  const std::string s = python_strip(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

Value filter_int(const Value& v, const Args& a) {
  const Value& dflt = arg(a, 0, "default", Value(0));
  const int64_t base = arg(a, 1, "base", Value(10)).is_integer() ? arg(a, 1, "base", Value(10)).as_int() : 10;
  if (v.is_integer()) return Value(v.as_int());
  if (v.kind() == Kind::kFloat) {
    const double d = v.as_number();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return dflt;
    return Value(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), static_cast<int>(base))) return Value(*i);
    if (auto d = parse_float(v.as_string()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
      return Value(static_cast<int64_t>(*d));
  }
  return dflt;
}

Value filter_float(const Value& v, const Args& a) {
  const Value& dflt = arg(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_number());
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return Value(*d);
  return dflt;
}

Value filter_round(const Value& v, const Args& a) {
  if (!v.is_number()) fail("round filter: expected a number, got " + type_name(v));
  const int64_t precision = arg(a, 0, "precision", Value(0)).is_integer() ? arg(a, 0, "precision", Value(0)).as_int() : 0;
  const Value& method = arg(a, 1, "method", Value("common"));
  // round(int, n) stays an int in Python; the other methods divide, so give floats.
  if (v.is_integer() && method.is_string() && method.as_string() == "common" && precision >= 0) return Value(v.as_int());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_number() * scale;
  const std::string m = method.is_string() ? method.as_string() : "";
  double r;
  if (m == "common") r = std::nearbyint(x);  // Python's round(): halves to even
  else if (m == "ceil") r = std::ceil(x);
  else if (m == "floor") r = std::floor(x);
  else fail("round filter: method must be 'common', 'ceil' or 'floor'");
  return Value(r / scale);
}

std::string filter_indent(const std::string& s, const Args& a) {
  const Value& width = arg(a, 0, "width", Value(4));
  const std::string indention =
      width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(width.is_integer() ? width.as_int() : 4, 0, 1 << 16)), ' ');
  const bool first = bool_arg(a, 1, "first", false), blank = bool_arg(a, 2, "blank", false);
  // Jinja2: split into lines (a trailing newline yields no extra line), indent every line
  // but the first, skipping blank ones unless `blank`.
  std::vector<std::string> lines;
  std::string text = s + "\n";
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  std::string rv = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    rv += "\n";
    if (blank || !lines[i].empty()) rv += indention;
    rv += lines[i];
  }
  if (first) rv = indention + rv;
  return rv;
}

std::string jinja_title(const std::string& s) {
  // Words begin after '-', whitespace or an opening bracket; each is capitalised.
  const std::u32string cps = utf8_decode(s);
  std::u32string out;
  bool word_start = true;
  for (char32_t c : cps) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c);
    if (sep) {
      out += c;
      word_start = true;
    } else if (word_start) {
      append_upper(out, c);
      word_start = false;
    } else {
      out += utf8_decode(to_lower(utf8_encode(std::u32string(1, c))));
    }
  }
  return utf8_encode(out);
}

std::string filter_replace(const std::string& s, const Args& a, Evaluator& ev) {
  const Value& old_v = arg(a, 0, "old", kNone);
  const Value& new_v = arg(a, 1, "new", kNone);
  const std::string old = to_str(old_v), rep = to_str(new_v);
  const int64_t count = arg(a, 2, "count", Value(-1)).is_integer() ? arg(a, 2, "count", Value(-1)).as_int() : -1;
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `new` around every character
    const std::u32string cps = utf8_decode(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
      ev.charge(rep.size() + 4);
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += rep;
    ev.charge(hit - pos + rep.size());
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Value filter_tojson(const Value& v, const Args& a) {
  a.check("tojson", 1, {"indent", "ensure_ascii", "separators", "sort_keys"});
  JsonOptions o;
  const Value& indent = arg(a, 0, "indent", kNone);
  if (indent.is_integer()) o.indent = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
  else if (!indent.is_none()) fail("tojson: indent must be an integer or None, not " + type_name(indent));
  o.ensure_ascii = bool_arg(a, 99, "ensure_ascii", false);
  o.sort_keys = bool_arg(a, 99, "sort_keys", false);
  const Value& sep = arg(a, 99, "separators", kNone);
  if (sep.is_list() && sep.items().size() == 2 && sep.items()[0].is_string() && sep.items()[1].is_string()) {
    o.item_separator = sep.items()[0].as_string();
    o.key_separator = sep.items()[1].as_string();
  } else if (!sep.is_none()) {
    fail("tojson: separators must be a pair of strings");
  }
  return Value(to_json(v, o));
}

// select / reject / selectattr / rejectattr: keep items whose test (or truth) is `keep`. A
// false value (none, undefined, empty) gives an empty list, its arguments unread, as Jinja2's
// `if value:` guard does (tool lists of templates that set `tools = none`).
Value filter_select(Evaluator& ev, const Value& seq, const Args& a, bool by_attribute, bool keep) {
  if (!truthy(seq)) return Value::list({});
  size_t next = 0;
  Value attribute = kNone;
  if (by_attribute) {
    if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = a.positional[next++];
  }
  std::string test;
  if (next < a.positional.size()) {
    if (!a.positional[next].is_string()) fail("the test name must be a string");
    test = a.positional[next++].as_string();
    if (!is_test(test)) fail("no test named '" + test + "'");
  }
  Args test_args{{a.positional.begin() + static_cast<long>(next), a.positional.end()}, a.named};
  List out;
  for (const Value& item : iterate(seq)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool passed = test.empty() ? truthy(subject) : apply_test(ev, test, subject, test_args);
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

// map(filter, ...) or map(attribute=...); a false value gives an empty list, as select's.
Value filter_map(Evaluator& ev, const Value& seq, const Args& a) {
  if (!truthy(seq)) return Value::list({});
  List out;
  if (const Value* attribute = a.get(99, "attribute")) {
    const Value& dflt = arg(a, 99, "default", Value());
    for (const Value& item : iterate(seq)) {
      Value v = attribute_path(item, *attribute);
      out.push_back(v.is_undefined() && !dflt.is_undefined() ? dflt : v);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].is_string()) fail("map needs a filter name or attribute=");
  const std::string name = a.positional[0].as_string();
  if (!is_filter(name)) fail("no filter named '" + name + "'");
  Args rest{{a.positional.begin() + 1, a.positional.end()}, a.named};
  for (const Value& item : iterate(seq)) out.push_back(apply_filter(ev, name, item, rest));
  return Value::list(std::move(out));
}

void sort_values(List& items, bool case_sensitive, const Value& attribute, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(key_of(item, attribute, case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  for (size_t i = 0; i < items.size(); ++i) items[i] = keyed[i].second;
}

// escape: markup is already escaped and passes through (markupsafe's escape()).
Value filter_escape(const Value& v) { return v.is_markup() ? v : Value::markup(html_escape(to_str(v))); }

// default(value, default_value="", boolean=false): the default for an undefined value (or,
// with boolean, a false one).
Value filter_default(const Value& v, const Args& a) {
  const Value& dflt = arg(a, 0, "default_value", Value(""));
  if (v.is_undefined() || (bool_arg(a, 1, "boolean", false) && !truthy(v))) return dflt;
  return v;
}

Value filter_wordcount(const Value& v) {
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(to_str(v))) {
    const bool w = is_word_char(c);
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value(words);
}

Value filter_abs(const Value& v) {
  if (v.is_integer()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  }
  if (v.is_number()) return Value(std::fabs(v.as_number()));
  fail("bad operand type for abs(): '" + type_name(v) + "'");
}

Value filter_first_or_last(const Value& v, bool first) {
  List items = iterate(v);
  if (items.empty())
    return Value::undefined(std::string("No ") + (first ? "first" : "last") + " item, sequence was empty.");
  return first ? items.front() : items.back();
}

Value filter_items(const Value& v) {
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict() && v.kind() != Kind::kNamespace) fail("items filter: expected a mapping, got " + type_name(v));
  List out;
  for (const auto& [k, item] : v.entries().entries) out.push_back(Value::list({k, item}, true));
  return Value::list(std::move(out));
}

Value filter_join(Evaluator& ev, const Value& v, const Args& a) {
  const std::string sep = to_str(arg(a, 0, "d", Value("")));
  const Value& attribute = arg(a, 1, "attribute", kNone);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute.is_none() ? item : attribute_path(item, attribute));
    ev.charge(out.size() > 0 ? sep.size() + 16 : 0);
  }
  ev.charge(out.size());
  return Value(std::move(out));
}

// A string reversed by code point; any other sequence by item.
Value filter_reverse(const Value& v) {
  if (v.is_string()) {
    std::u32string cps = utf8_decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(utf8_encode(cps));
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_sort(const Value& v, const Args& a) {
  List items = iterate(v);
  sort_values(items, bool_arg(a, 1, "case_sensitive", false), arg(a, 2, "attribute", kNone),
              bool_arg(a, 0, "reverse", false));
  return Value::list(std::move(items));
}

// dictsort(case_sensitive=false, by="key", reverse=false): the (key, value) pairs, sorted.
Value filter_dictsort(const Value& v, const Args& a) {
  if (!v.is_dict()) fail("dictsort filter: expected a mapping, got " + type_name(v));
  const bool cs = bool_arg(a, 0, "case_sensitive", false);
  const Value& by = arg(a, 1, "by", Value("key"));
  const bool reverse = bool_arg(a, 2, "reverse", false);
  const bool by_value = by.is_string() && by.as_string() == "value";
  if (!by_value && !(by.is_string() && by.as_string() == "key")) fail("dictsort: by must be 'key' or 'value'");
  List pairs;
  for (const auto& [k, item] : v.entries().entries) pairs.push_back(Value::list({k, item}, true));
  sort_values(pairs, cs, Value(static_cast<int64_t>(by_value ? 1 : 0)), reverse);
  return Value::list(std::move(pairs));
}

// The items in order, each kept only the first time its key is seen.
Value filter_unique(const Value& v, const Args& a) {
  const bool cs = bool_arg(a, 0, "case_sensitive", false);
  const Value& attribute = arg(a, 1, "attribute", kNone);
  List out, seen;
  for (const Value& item : iterate(v)) {
    Value key = key_of(item, attribute, cs);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

// min / max: the first item with the smallest / largest key.
Value filter_extreme(const Value& v, const Args& a, bool smallest) {
  const bool cs = bool_arg(a, 0, "case_sensitive", false);
  const Value& attribute = arg(a, 1, "attribute", kNone);
  List items = iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(key_of(items[i], attribute, cs), key_of(items[best], attribute, cs));
    if (smallest ? c < 0 : c > 0) best = i;
  }
  return items[best];
}

Value filter_sum(Evaluator& ev, const Value& v, const Args& a) {
  const Value& attribute = arg(a, 0, "attribute", kNone);
  Value total = arg(a, 1, "start", Value(0));
  for (const Value& item : iterate(v))
    total = binary_op("+", total, attribute.is_none() ? item : attribute_path(item, attribute), ev);
  return total;
}

// batch(linecount, fill_with=None): lists of linecount items; the last one padded with
// fill_with when given.
Value filter_batch(const Value& v, const Args& a) {
  const Value& n = arg(a, 0, "linecount", kNone);
  if (!n.is_integer() || n.as_int() <= 0) fail("batch filter: linecount must be a positive integer");
  const Value* fill = a.get(1, "fill_with");
  List out, cur;
  for (const Value& item : iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n.as_int()) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < n.as_int()) cur.push_back(*fill);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

struct Filter {
  std::string_view name;
  // Takes an undefined value as it is (printing it as "", Jinja2's soft_str, or handling it
  // as Jinja2 does); the other filters reject it.
  bool takes_undefined;
  Value (*apply)(Evaluator& ev, const Value& v, const Args& a);
};

constexpr bool kTakesUndefined = true;
constexpr bool kRejectsUndefined = false;

const Filter kFilters[] = {
    {"default", kTakesUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_default(v, a); }},
    {"d", kTakesUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_default(v, a); }},
    {"safe", kTakesUndefined,
     [](Evaluator&, const Value& v, const Args&) { return Value::markup(to_str(v)); }},
    {"string", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value(to_str(v)); }},
    {"length", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value(length(v)); }},
    {"count", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value(length(v)); }},
    {"tojson", kTakesUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_tojson(v, a); }},
    {"trim", kTakesUndefined,
     [](Evaluator&, const Value& v, const Args& a) {
       return Value(python_strip(to_str(v), a.get(0, "chars"), true, true));
     }},
    {"upper", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value(to_upper(to_str(v))); }},
    {"lower", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value(to_lower(to_str(v))); }},
    {"title", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value(jinja_title(to_str(v))); }},
    {"capitalize", kTakesUndefined,
     [](Evaluator&, const Value& v, const Args&) { return Value(python_capitalize(to_str(v))); }},
    {"escape", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_escape(v); }},
    {"e", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_escape(v); }},
    {"forceescape", kTakesUndefined,
     [](Evaluator&, const Value& v, const Args&) { return Value::markup(html_escape(to_str(v))); }},
    {"replace", kTakesUndefined,
     [](Evaluator& ev, const Value& v, const Args& a) { return Value(filter_replace(to_str(v), a, ev)); }},
    {"indent", kTakesUndefined,
     [](Evaluator&, const Value& v, const Args& a) { return Value(filter_indent(to_str(v), a)); }},
    {"int", kTakesUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_int(v, a); }},
    {"float", kTakesUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_float(v, a); }},
    {"round", kTakesUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_round(v, a); }},
    {"format", kTakesUndefined,
     [](Evaluator& ev, const Value& v, const Args& a) {
       return binary_op("%", Value(to_str(v)), Value::list(a.positional, true), ev);
     }},
    {"wordcount", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_wordcount(v); }},
    {"abs", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_abs(v); }},
    {"attr", kTakesUndefined,
     [](Evaluator&, const Value& v, const Args& a) { return get_attr(v, to_str(arg(a, 0, "name", Value("")))); }},
    {"first", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_first_or_last(v, true); }},
    {"last", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_first_or_last(v, false); }},
    {"list", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return Value::list(iterate(v)); }},
    {"items", kTakesUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_items(v); }},
    {"join", kTakesUndefined, filter_join},
    {"reverse", kRejectsUndefined, [](Evaluator&, const Value& v, const Args&) { return filter_reverse(v); }},
    {"map", kTakesUndefined, filter_map},
    {"select", kTakesUndefined,
     [](Evaluator& ev, const Value& v, const Args& a) { return filter_select(ev, v, a, false, true); }},
    {"reject", kTakesUndefined,
     [](Evaluator& ev, const Value& v, const Args& a) { return filter_select(ev, v, a, false, false); }},
    {"selectattr", kTakesUndefined,
     [](Evaluator& ev, const Value& v, const Args& a) { return filter_select(ev, v, a, true, true); }},
    {"rejectattr", kTakesUndefined,
     [](Evaluator& ev, const Value& v, const Args& a) { return filter_select(ev, v, a, true, false); }},
    {"sort", kRejectsUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_sort(v, a); }},
    {"dictsort", kRejectsUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_dictsort(v, a); }},
    {"unique", kRejectsUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_unique(v, a); }},
    {"min", kRejectsUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_extreme(v, a, true); }},
    {"max", kRejectsUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_extreme(v, a, false); }},
    {"sum", kRejectsUndefined, filter_sum},
    {"batch", kRejectsUndefined, [](Evaluator&, const Value& v, const Args& a) { return filter_batch(v, a); }},
};

const Filter* find_filter(std::string_view name) {
  auto it = std::find_if(std::begin(kFilters), std::end(kFilters), [&](const Filter& f) { return f.name == name; });
  return it == std::end(kFilters) ? nullptr : it;
}

}  // namespace

bool is_filter(std::string_view name) { return find_filter(name) != nullptr; }

Value apply_filter(Evaluator& ev, std::string_view name, const Value& v, const Args& a) {
  const Filter* filter = find_filter(name);
  if (v.is_undefined() && (filter == nullptr || !filter->takes_undefined)) fail_undefined(v);
  if (filter == nullptr) fail("no filter named '" + std::string(name) + "'");
  return filter->apply(ev, v, a);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace tessera::jinja
