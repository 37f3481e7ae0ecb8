#include "common/config_values.h"

#include <algorithm>
#include <charconv>

#include "common/string_util.h"

namespace tessera::config_values {

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing (null)";
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  return "'" + n.Scalar() + "'";
}

std::string Where::got(const YAML::Node& n) const {
  if (!is_secret_config_path(path) || !n.IsScalar()) return describe(n);
  return "a string of " + std::to_string(n.Scalar().size()) + " characters (not shown: " + path + " holds secrets)";
}

Status expect_scalar(const YAML::Node& n, const Where& w, const std::string& expected) {
  if (n.IsScalar()) return Status::ok();
  return w.error("expected " + expected + ", got " + w.got(n));
}

// ---- scalar readers ---------------------------------------------------------------------

Status read_int(const YAML::Node& n, const Where& w, int64_t lo, int64_t hi, int64_t* out) {
  const std::string expected = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  TESSERA_RETURN_IF_ERROR(expect_scalar(n, w, expected));
  const std::string& s = n.Scalar();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) {
    return w.error("expected " + expected + ", got " + w.got(n));
  }
  *out = v;
  return Status::ok();
}

Status read_int32(const YAML::Node& n, const Where& w, int64_t lo, int64_t hi, int* out) {
  int64_t v = 0;
  TESSERA_RETURN_IF_ERROR(read_int(n, w, lo, hi, &v));
  *out = static_cast<int>(v);
  return Status::ok();
}

// A plain number that `accepts`, else an error saying what was `expected`.
Status read_number(const YAML::Node& n, const Where& w, const std::string& expected, bool (*accepts)(double),
                   double* out) {
  TESSERA_RETURN_IF_ERROR(expect_scalar(n, w, expected));
  const std::string& s = n.Scalar();
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !accepts(v)) {
    return w.error("expected " + expected + ", got " + w.got(n));
  }
  *out = v;
  return Status::ok();
}

// A number in (0, 1].
Status read_fraction(const YAML::Node& n, const Where& w, double* out) {
  return read_number(n, w, "a number in (0, 1]", [](double v) { return v > 0.0 && v <= 1.0; }, out);
}

// scheduler.max_decode_slowdown and max_tpot_slowdown: 0 (off) or a number in (1, 1000].
Status read_slowdown(const YAML::Node& n, const Where& w, double* out) {
  return read_number(n, w, "0 (no cap) or a number in (1, 1000]",
                     [](double v) { return v == 0.0 || (v > 1.0 && v <= 1000.0); }, out);
}

Status read_bool(const YAML::Node& n, const Where& w, bool* out) {
  TESSERA_RETURN_IF_ERROR(expect_scalar(n, w, "true or false"));
  const std::string s = ascii_lower(n.Scalar());
  if (s == "true" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "false" || s == "no" || s == "off") {
    *out = false;
  } else {
    return w.error("expected true or false, got " + w.got(n));
  }
  return Status::ok();
}

Status read_string(const YAML::Node& n, const Where& w, std::string* out) {
  TESSERA_RETURN_IF_ERROR(expect_scalar(n, w, "a string"));
  *out = n.Scalar();
  return Status::ok();
}

Status read_endpoint(const YAML::Node& n, const Where& w, std::string* out) {
  std::string s;
  TESSERA_RETURN_IF_ERROR(read_string(n, w, &s));
  if (s.rfind("tcp://", 0) != 0 && s.rfind("ipc://", 0) != 0 && s.rfind("inproc://", 0) != 0) {
    return w.error("expected a ZeroMQ endpoint (tcp://host:port, ipc://path or inproc://name), got " +
                   w.got(n));
  }
  *out = s;
  return Status::ok();
}

// An endpoint, or "" for "off" (server.zmq_client: the ZeroMQ client API is not served).
Status read_optional_endpoint(const YAML::Node& n, const Where& w, std::string* out) {
  if (n.IsScalar() && n.Scalar().empty()) {
    out->clear();
    return Status::ok();
  }
  return read_endpoint(n, w, out);
}

Status read_string_list(const YAML::Node& n, const Where& w, bool non_empty, std::vector<std::string>* out) {
  if (!n.IsSequence()) return w.error("expected a list of strings, got " + w.got(n));
  if (non_empty && n.size() == 0) return w.error("expected a non-empty list of strings");
  std::vector<std::string> v;
  for (size_t i = 0; i < n.size(); ++i) {
    std::string s;
    TESSERA_RETURN_IF_ERROR(read_string(n[i], w.child("[" + std::to_string(i) + "]", n[i]), &s));
    if (s.empty()) return w.child("[" + std::to_string(i) + "]", n[i]).error("expected a non-empty string");
    v.push_back(std::move(s));
  }
  *out = std::move(v);
  return Status::ok();
}

Status read_string_map(const YAML::Node& n, const Where& w, std::map<std::string, std::string>* out) {
  if (n.IsNull()) {
    out->clear();
    return Status::ok();
  }
  if (!n.IsMap()) return w.error("expected a map of linear name -> model_type, got " + w.got(n));
  std::map<std::string, std::string> m;
  for (const auto& kv : n) {
    std::string key;
    TESSERA_RETURN_IF_ERROR(read_string(kv.first, w, &key));
    const Where cw = w.child("." + key, kv.second);
    std::string value;
    TESSERA_RETURN_IF_ERROR(read_string(kv.second, cw, &value));
    if (key.empty() || value.empty()) return cw.error("expected a non-empty linear name and model_type");
    m[key] = value;
  }
  *out = std::move(m);
  return Status::ok();
}

Status read_policy(const YAML::Node& n, const Where& w, std::map<std::string, std::vector<std::string>>* out) {
  if (n.IsNull()) {
    out->clear();
    return Status::ok();
  }
  if (!n.IsMap()) return w.error("expected a map of block name -> list of linear names, got " + w.got(n));
  std::map<std::string, std::vector<std::string>> m;
  for (const auto& kv : n) {
    std::string key;
    TESSERA_RETURN_IF_ERROR(read_string(kv.first, w, &key));
    TESSERA_RETURN_IF_ERROR(read_string_list(kv.second, w.child("." + key, kv.second), true, &m[key]));
  }
  *out = std::move(m);
  return Status::ok();
}

namespace {

// A list of {match: REGEX, <value_key>: VALUE} rules, both keys required: `read_value(node,
// where, &rule)` reads VALUE into the rule and `compile` compiles its regex when the config is read.
template <typename Rule, typename ReadValue>
Status read_match_rules(const YAML::Node& n, const Where& w, const std::string& value_key,
                        const std::string& value_choices, const ReadValue& read_value,
                        Status (*compile)(Rule*), std::vector<Rule>* out) {
  const std::string shape = "{match: REGEX, " + value_key + ": " + value_choices + "}";
  if (n.IsNull()) {
    out->clear();
    return Status::ok();
  }
  if (!n.IsSequence()) return w.error("expected a list of " + shape + ", got " + w.got(n));
  std::vector<Rule> rules;
  for (size_t i = 0; i < n.size(); ++i) {
    const YAML::Node& r = n[i];
    const Where rw = w.child("[" + std::to_string(i) + "]", r);
    if (!r.IsMap()) return rw.error("expected " + shape + ", got " + rw.got(r));
    Rule rule;
    bool has_match = false, has_value = false;
    for (const auto& kv : r) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const Where kw = rw.child("." + key, kv.second);
      if (key == "match") {
        TESSERA_RETURN_IF_ERROR(read_string(kv.second, kw, &rule.match));
        if (Status st = compile(&rule); !st.is_ok()) return kw.error(st.message());
        has_match = true;
      } else if (key == value_key) {
        TESSERA_RETURN_IF_ERROR(read_value(kv.second, kw, &rule));
        has_value = true;
      } else {
        return kw.error("unknown key" + suggestion(key, {"match", value_key}));
      }
    }
    if (!has_match || !has_value)
      return rw.error("missing key '" + (has_match ? value_key : std::string("match")) + "'");
    rules.push_back(std::move(rule));
  }
  *out = std::move(rules);
  return Status::ok();
}

}  // namespace

Status read_rules(const YAML::Node& n, const Where& w, std::vector<TpRuleConfig>* out) {
  return read_match_rules(
      n, w, "role", "row|column|keep",
      [](const YAML::Node& v, const Where& vw, TpRuleConfig* rule) {
        return read_enum<TpRole>(v, vw, {{"column", TpRole::kColumn}, {"row", TpRole::kRow}, {"keep", TpRole::kKeep}},
                                 &rule->role);
      },
      compile_tp_rule_regex, out);
}

Status read_quant_rules(const YAML::Node& n, const Where& w, std::vector<QuantRuleConfig>* out) {
  return read_match_rules(
      n, w, "quantize", "int8|int4|none",
      [](const YAML::Node& v, const Where& vw, QuantRuleConfig* rule) {
        return read_enum<WeightQuantization>(
            v, vw,
            {{"int8", WeightQuantization::kInt8}, {"int4", WeightQuantization::kInt4}, {"none", WeightQuantization::kNone}},
            &rule->quantize);
      },
      compile_quant_rule_regex, out);
}

// ---- a misspelt key -------------------------------------------------------------------

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

// " (did you mean 'http'?)" or " (expected one of: a, b)".
std::string suggestion(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(ascii_lower(key), ascii_lower(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (!best.empty() && (best_d <= 2 || best_d * 3 <= std::max(key.size(), best.size()))) {
    return " (did you mean '" + best + "'?)";
  }
  std::string list;
  for (const auto& c : candidates) list += (list.empty() ? "" : ", ") + c;
  return " (expected one of: " + list + ")";
}

}  // namespace tessera::config_values
