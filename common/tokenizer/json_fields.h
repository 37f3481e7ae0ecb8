#pragma once
// Typed reads of tokenizer.json fields that turn a wrong or missing field into a Status
// naming its path ("pre_tokenizer.pretokenizers[1].behavior"), never a JSON exception.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/tokenizer/regex.h"

namespace tessera::tok {

using Json = nlohmann::json;

inline std::string field_path(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

inline StatusOr<std::string> get_string(const Json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return invalid_argument(field_path(where, key) + ": missing");
  if (!it->is_string()) return invalid_argument(field_path(where, key) + ": expected a string");
  return it->get<std::string>();
}

inline StatusOr<std::string> get_string_or(const Json& j, const std::string& key, const std::string& where,
                                           const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return invalid_argument(field_path(where, key) + ": expected a string");
  return it->get<std::string>();
}

inline StatusOr<bool> get_bool_or(const Json& j, const std::string& key, const std::string& where, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return invalid_argument(field_path(where, key) + ": expected true or false");
  return it->get<bool>();
}

inline StatusOr<int64_t> get_int_or(const Json& j, const std::string& key, const std::string& where,
                                    int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return invalid_argument(field_path(where, key) + ": expected an integer");
  return it->get<int64_t>();
}

inline StatusOr<const Json*> get_array(const Json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return invalid_argument(field_path(where, key) + ": missing");
  if (!it->is_array()) return invalid_argument(field_path(where, key) + ": expected an array");
  return &*it;
}

inline StatusOr<std::string> get_type(const Json& j, const std::string& where) {
  if (!j.is_object()) return invalid_argument((where.empty() ? "value" : where) + ": expected an object");
  return get_string(j, "type", where);
}

// A tokenizers `pattern` field: {"String": "..."} or {"Regex": "..."}.
struct PatternSpec {
  std::string text;
  bool is_regex = false;
};
inline StatusOr<PatternSpec> get_pattern(const Json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  const std::string path = field_path(where, key);
  if (it == j.end() || !it->is_object()) return invalid_argument(path + ": expected {\"String\": ...} or {\"Regex\": ...}");
  if (auto s = it->find("String"); s != it->end() && s->is_string()) return PatternSpec{s->get<std::string>(), false};
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) return PatternSpec{r->get<std::string>(), true};
  return invalid_argument(path + ": expected {\"String\": ...} or {\"Regex\": ...}");
}

inline StatusOr<std::shared_ptr<const Regex>> compile_pattern(const PatternSpec& spec, const std::string& where) {
  auto re = Regex::compile(spec.text, !spec.is_regex);
  if (!re.is_ok()) return re.status().with_context(where);
  return re;
}

}  // namespace tessera::tok
