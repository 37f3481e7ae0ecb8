#include "worker/config_fields.h"

namespace tessera::config_fields {

const nlohmann::json* find(const nlohmann::json& config, const Keys& keys, std::string* found) {
  for (const std::string& k : keys) {
    auto it = config.find(k);
    if (it != config.end() && !it->is_null()) {
      if (found != nullptr) *found = k;
      return &*it;
    }
  }
  return nullptr;
}

std::string key_list(const Keys& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "\"" : "\" or \"") + k;
  return s + "\"";
}

Status read_positive_int(const nlohmann::json& config, const std::string& source, const Keys& keys,
                         bool required, int64_t* out) {
  std::string key;
  const nlohmann::json* v = find(config, keys, &key);
  if (v == nullptr) {
    if (required) return invalid_argument(source + ": missing key " + key_list(keys));
    return Status::ok();
  }
  if (!v->is_number_integer() || v->get<int64_t>() <= 0) {
    return invalid_argument(source + ": key \"" + key + "\" must be a positive integer, got " + v->dump());
  }
  *out = v->get<int64_t>();
  return Status::ok();
}

Status read_int(const nlohmann::json& config, const std::string& source, const Keys& keys, int64_t* out) {
  std::string key;
  const nlohmann::json* v = find(config, keys, &key);
  if (v == nullptr) return Status::ok();
  if (!v->is_number_integer() || v->get<int64_t>() < 0) {
    return invalid_argument(source + ": key \"" + key + "\" must be an integer >= 0, got " + v->dump());
  }
  *out = v->get<int64_t>();
  return Status::ok();
}

Status read_positive_float(const nlohmann::json& config, const std::string& source, const Keys& keys,
                           float* out) {
  return read_positive_float(config, source, keys, /*required=*/false, out);
}

Status read_positive_float(const nlohmann::json& config, const std::string& source, const Keys& keys,
                           bool required, float* out) {
  std::string key;
  const nlohmann::json* v = find(config, keys, &key);
  if (v == nullptr) {
    if (required) return invalid_argument(source + ": missing key " + key_list(keys));
    return Status::ok();
  }
  if (!v->is_number() || v->get<double>() <= 0) {
    return invalid_argument(source + ": key \"" + key + "\" must be a positive number, got " + v->dump());
  }
  *out = v->get<float>();
  return Status::ok();
}

Status read_bool(const nlohmann::json& config, const std::string& source, const Keys& keys, bool* out) {
  std::string key;
  const nlohmann::json* v = find(config, keys, &key);
  if (v == nullptr) return Status::ok();
  if (!v->is_boolean()) {
    return invalid_argument(source + ": key \"" + key + "\" must be true or false, got " + v->dump());
  }
  *out = v->get<bool>();
  return Status::ok();
}

Status read_string(const nlohmann::json& config, const std::string& source, const Keys& keys, std::string* out) {
  std::string key;
  const nlohmann::json* v = find(config, keys, &key);
  if (v == nullptr) return Status::ok();
  if (!v->is_string()) return invalid_argument(source + ": key \"" + key + "\" must be a string, got " + v->dump());
  *out = v->get<std::string>();
  return Status::ok();
}

}  // namespace tessera::config_fields
