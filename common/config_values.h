#pragma once
// Reading one value of the YAML configuration (common/config.cc's schema): where it came from
// for the error ("cfg.yaml:4:5: server.http.port: expected ..."), the typed readers, and the
// "did you mean" of a misspelt key. Every reader either sets *out or returns an error naming
// the key and what it expected; a secret's value is never shown.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace tessera::config_values {

// "nothing (null)", "a map", "a list" or the scalar quoted.
std::string describe(const YAML::Node& n);

// Where a value came from: "cfg.yaml:4:5: server.http.port" or "--set server.http.port".
struct Where {
  std::string source;
  std::string path;
  YAML::Mark mark = YAML::Mark::null_mark();

  Status error(const std::string& msg) const {
    std::string prefix = source;
    if (!mark.is_null()) prefix += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
    return invalid_argument(prefix + ": " + path + ": " + msg);
  }
  Where child(const std::string& key, const YAML::Node& node) const {
    return Where{source, path + key, node.Mark().is_null() ? mark : node.Mark()};
  }
  // What was given, for "expected X, got Y"; a secret's value is never shown, only its shape.
  std::string got(const YAML::Node& n) const;
};

Status expect_scalar(const YAML::Node& n, const Where& w, const std::string& expected);

Status read_int(const YAML::Node& n, const Where& w, int64_t lo, int64_t hi, int64_t* out);
Status read_int32(const YAML::Node& n, const Where& w, int64_t lo, int64_t hi, int* out);
// A plain number that `accepts`, else an error saying what was `expected`.
Status read_number(const YAML::Node& n, const Where& w, const std::string& expected, bool (*accepts)(double),
                   double* out);
// A number in (0, 1].
Status read_fraction(const YAML::Node& n, const Where& w, double* out);
// scheduler.max_decode_slowdown and max_tpot_slowdown: 0 (off) or a number in (1, 1000].
Status read_slowdown(const YAML::Node& n, const Where& w, double* out);
// true/yes/on or false/no/off, any case.
Status read_bool(const YAML::Node& n, const Where& w, bool* out);
Status read_string(const YAML::Node& n, const Where& w, std::string* out);
// A ZeroMQ endpoint: tcp://, ipc:// or inproc://.
Status read_endpoint(const YAML::Node& n, const Where& w, std::string* out);
// An endpoint, or "" for "off" (server.zmq_client: the ZeroMQ client API is not served).
Status read_optional_endpoint(const YAML::Node& n, const Where& w, std::string* out);
Status read_string_list(const YAML::Node& n, const Where& w, bool non_empty, std::vector<std::string>* out);
// A map of linear name -> model_type (auto_tp's keep_linear and the like); null clears it.
Status read_string_map(const YAML::Node& n, const Where& w, std::map<std::string, std::string>* out);
// A map of block name -> list of linear names (auto_tp's policy); null clears it.
Status read_policy(const YAML::Node& n, const Where& w, std::map<std::string, std::vector<std::string>>* out);
// parallel.auto_tp.rules: a list of {match: REGEX, role: row|column|keep}; null clears it.
Status read_rules(const YAML::Node& n, const Where& w, std::vector<TpRuleConfig>* out);
// model.quantization_rules: a list of {match: REGEX, quantize: int8|int4|none}; null clears it.
Status read_quant_rules(const YAML::Node& n, const Where& w, std::vector<QuantRuleConfig>* out);

template <typename E>
Status read_enum(const YAML::Node& n, const Where& w, const std::vector<std::pair<const char*, E>>& names,
                 E* out) {
  std::string expected;
  for (const auto& [name, value] : names) expected += (expected.empty() ? "" : " | ") + std::string(name);
  TESSERA_RETURN_IF_ERROR(expect_scalar(n, w, expected));
  for (const auto& [name, value] : names) {
    if (n.Scalar() == name) {
      *out = value;
      return Status::ok();
    }
  }
  return w.error("expected " + expected + ", got " + w.got(n));
}

// " (did you mean 'http'?)" or " (expected one of: a, b)".
std::string suggestion(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace tessera::config_values
