// The Python methods templates call on str, dict and list values, and the code-point
// slicing and stripping they share with the filters.
#include <algorithm>

#include "coordinator/api/jinja/builtins.h"
#include "coordinator/api/jinja/evaluator.h"
#include "coordinator/api/jinja/unicode.h"

namespace tessera::jinja {
namespace {

// Python's slice.indices(): the positions a[start:stop:step] visits.
std::vector<int64_t> slice_positions(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_integer()) fail(std::string("slice ") + what + " must be an integer or None, not " + type_name(v));
    return v.as_int();
  };
  const int64_t st = as_index(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(as_index(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_index(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(i);
  return out;
}

std::u32string code_points(const Value& v) { return utf8_decode(v.as_string()); }

const std::string& string_arg(const Args& a, size_t i, std::string_view name, std::string_view method) {
  const Value* v = a.get(i, name);
  if (v == nullptr || !v->is_string())
    fail(std::string(method) + "() argument '" + std::string(name) + "' must be str, not " +
         (v ? type_name(*v) : std::string("missing")));
  return v->as_string();
}

// Python's str.split(sep, maxsplit).
List python_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->is_none()) {
    const std::u32string cps = utf8_decode(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_python_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t end = cps.size();
        while (end > i && is_python_space(cps[end - 1])) --end;
        out.emplace_back(utf8_encode(cps.substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_python_space(cps[j])) ++j;
      out.emplace_back(utf8_encode(cps.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  if (!sep->is_string()) fail("split() separator must be str or None, not " + type_name(*sep));
  const std::string& d = sep->as_string();
  if (d.empty()) fail("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix, const char* method) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) fail(std::string(method) + " first arg must be str or a tuple of str, not " + type_name(a));
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.items())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

// Python's str.format for {} / {0} / {name} fields (no format specs or conversions).
std::string python_format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else fail("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos)
      fail("str.format: format specs and conversions ('" + field + "') are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.positional.size() ? &a.positional[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      const size_t k = std::stoul(field);
      v = k < a.positional.size() ? &a.positional[k] : nullptr;
    } else {
      for (const auto& [k, val] : a.named)
        if (k == field) v = &val;
      if (v == nullptr) fail("str.format: no argument named '" + field + "'");
    }
    if (v == nullptr) fail("Replacement index " + field + " out of range for positional args tuple");
    out += to_str(*v);
    i = close;
  }
  return out;
}

int64_t int_arg(const Args& a, size_t i, std::string_view name, int64_t dflt) {
  const Value* v = a.get(i, name);
  if (v == nullptr || v->is_none()) return dflt;
  if (!v->is_integer()) fail("'" + type_name(*v) + "' object cannot be interpreted as an integer");
  return v->as_int();
}

Value string_method(const Value& self, const std::string& name, Evaluator& ev, const Args& a) {
  const std::string& s = self.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    a.check(name, 1, {"chars"});
    return Value(python_strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "upper") return Value(to_upper(s));
  if (name == "lower") return Value(to_lower(s));
  if (name == "title") return Value(python_title(s));
  if (name == "capitalize") return Value(python_capitalize(s));
  if (name == "split") {
    a.check(name, 2, {"sep", "maxsplit"});
    return Value::list(python_split(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1)));
  }
  if (name == "splitlines") {
    List out;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t nl = s.find('\n', pos);
      if (nl == std::string::npos) {
        out.emplace_back(s.substr(pos));
        break;
      }
      out.emplace_back(s.substr(pos, nl - pos));
      pos = nl + 1;
    }
    return Value::list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    a.check(name, 1, {});
    if (a.positional.empty()) fail(name + "() takes at least 1 argument (0 given)");
    return Value(affix_matches(s, a.positional[0], name == "startswith", name.c_str()));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& x = string_arg(a, 0, "prefix", name);
    const bool pre = name == "removeprefix";
    if (affix_matches(s, Value(x), pre, name.c_str()))
      return Value(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    return self;
  }
  if (name == "replace") {
    a.check(name, 3, {"count"});
    const std::string& old = string_arg(a, 0, "old", name);
    const std::string& rep = string_arg(a, 1, "new", name);
    return Value(apply_filter(ev, "replace", self, Args{{Value(old), Value(rep), Value(int_arg(a, 2, "count", -1))}, {}}));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    const std::string& sub = string_arg(a, 0, "sub", name);
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    const size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") fail("substring not found");
      return Value(int64_t{-1});
    }
    return Value(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
  }
  if (name == "join") {
    if (a.positional.size() != 1) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(a.positional[0])) {
      if (!v.is_string()) fail("sequence item: expected str instance, " + type_name(v) + " found");
      if (!first) out += s;
      first = false;
      out += v.as_string();
      ev.charge(v.as_string().size() + s.size());
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(python_format(s, a));
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    const std::u32string cps = code_points(self);
    if (cps.empty()) return Value(false);
    bool cased = false;
    for (char32_t c : cps) {
      const bool digit = c >= '0' && c <= '9';
      const bool alpha = is_cased_upper(c) || is_cased_lower(c) || (c >= 0x80 && is_word_char(c) && !digit);
      if (name == "isdigit" && !digit) return Value(false);
      if (name == "isalpha" && !alpha) return Value(false);
      if (name == "isalnum" && !alpha && !digit) return Value(false);
      if (name == "isspace" && !is_python_space(c)) return Value(false);
      if (name == "isupper" && is_cased_lower(c)) return Value(false);
      if (name == "islower" && is_cased_upper(c)) return Value(false);
      cased = cased || is_cased_upper(c) || is_cased_lower(c);
    }
    return Value((name != "isupper" && name != "islower") || cased);
  }
  fail("'str' object has no method '" + name + "'");
}

constexpr const char* kStringMethods[] = {
    "strip",   "lstrip", "rstrip", "upper",  "lower",   "title",   "capitalize", "split",        "splitlines",
    "startswith", "endswith", "removeprefix", "removesuffix", "replace", "find", "rfind",  "count",
    "index",   "join",   "format", "isdigit", "isalpha", "isalnum", "isspace",    "isupper",      "islower"};

}  // namespace

std::string python_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::u32string cps = utf8_decode(s);
  std::u32string set;
  const bool whitespace = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!whitespace) {
    if (!chars->is_string()) fail("strip arg must be None or str, not " + type_name(*chars));
    set = utf8_decode(chars->as_string());
  }
  auto strip_it = [&](char32_t c) { return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(std::u32string_view(cps).substr(b, e - b));
}

std::string slice_string(const std::string& s, const Value& start, const Value& stop, const Value& step) {
  const std::u32string cps = utf8_decode(s);
  std::u32string out;
  for (int64_t i : slice_positions(static_cast<int64_t>(cps.size()), start, stop, step)) out += cps[static_cast<size_t>(i)];
  return utf8_encode(out);
}

Value slice_list(const Value& list, const Value& start, const Value& stop, const Value& step) {
  List out;
  for (int64_t i : slice_positions(static_cast<int64_t>(list.items().size()), start, stop, step))
    out.push_back(list.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(out), list.is_tuple());
}

Value method_of(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    for (const char* m : kStringMethods)
      if (name == m)
        return Value::callable("str." + name, [obj, name](Evaluator& ev, const Args& a) { return string_method(obj, name, ev, a); });
    return Value();
  }
  if (obj.is_dict()) {
    if (name == "items" || name == "keys" || name == "values") {
      return Value::callable("dict." + name, [obj, name](Evaluator&, const Args& a) {
        a.check(name, 0, {});
        List out;
        for (const auto& [k, v] : obj.entries().entries) {
          if (name == "items") out.push_back(Value::list({k, v}, true));
          else if (name == "keys") out.emplace_back(k);
          else out.push_back(v);
        }
        return Value::list(std::move(out));
      });
    }
    if (name == "get") {
      return Value::callable("dict.get", [obj](Evaluator&, const Args& a) {
        a.check("get", 2, {});
        if (a.positional.empty()) fail("get expected at least 1 argument, got 0");
        if (const Value* v = obj.entries().find_key(a.positional[0])) return *v;
        return a.positional.size() > 1 ? a.positional[1] : Value::none();
      });
    }
    return Value();
  }
  if (obj.is_list()) {
    // append and pop are refused by transformers' immutable sandbox but allowed here: some
    // templates written for other engines use them (Kimi K2's queues its tool-call ids).
    if (name == "append" && !obj.is_tuple()) {
      return Value::callable("list.append", [obj](Evaluator& ev, const Args& a) {
        ev.track_mutated(obj.shared_items());
        if (a.positional.size() != 1 || !a.named.empty()) fail("append() takes exactly one argument");
        if (obj.items().size() >= 10'000'000) fail("list too long");
        obj.items().push_back(a.positional[0]);
        return Value::none();
      });
    }
    if (name == "pop" && !obj.is_tuple()) {
      return Value::callable("list.pop", [obj](Evaluator& ev, const Args& a) {
        ev.track_mutated(obj.shared_items());
        if (a.positional.size() > 1 || !a.named.empty()) fail("pop() takes at most one positional argument");
        List& items = obj.items();
        if (items.empty()) fail("pop from empty list");
        int64_t i = -1;
        if (!a.positional.empty()) {
          if (!a.positional[0].is_integer())
            fail("'" + type_name(a.positional[0]) + "' object cannot be interpreted as an integer");
          i = a.positional[0].as_int();
        }
        const int64_t n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) fail("pop index out of range");
        Value v = std::move(items[static_cast<size_t>(i)]);
        items.erase(items.begin() + i);
        return v;
      });
    }
    if (name == "index" || name == "count") {
      return Value::callable("list." + name, [obj, name](Evaluator&, const Args& a) {
        if (a.positional.size() != 1) fail(name + "() takes exactly one argument");
        int64_t n = 0, at = -1;
        for (size_t i = 0; i < obj.items().size(); ++i) {
          if (!equals(obj.items()[i], a.positional[0])) continue;
          if (at < 0) at = static_cast<int64_t>(i);
          ++n;
        }
        if (name == "count") return Value(n);
        if (at < 0) fail(repr(a.positional[0]) + " is not in list");
        return Value(at);
      });
    }
  }
  return Value();
}

}  // namespace tessera::jinja
