#pragma once
// Typed reads of config.json fields for the model-config parser and the architecture
// rows' adapt hooks. Each takes a list of key aliases (the first present, non-null one is
// read) and names the file and key in its error. An absent key leaves *out unchanged.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::config_fields {

using Keys = std::vector<std::string>;

// The first of `keys` present and not null; nullptr when none is. *found gets its name.
const nlohmann::json* find(const nlohmann::json& config, const Keys& keys, std::string* found = nullptr);
// "\"a\" or \"b\"".
std::string key_list(const Keys& keys);

Status read_positive_int(const nlohmann::json& config, const std::string& source, const Keys& keys,
                         bool required, int64_t* out);
// Any integer >= 0.
Status read_int(const nlohmann::json& config, const std::string& source, const Keys& keys, int64_t* out);
Status read_positive_float(const nlohmann::json& config, const std::string& source, const Keys& keys,
                           float* out);
Status read_positive_float(const nlohmann::json& config, const std::string& source, const Keys& keys,
                           bool required, float* out);
Status read_bool(const nlohmann::json& config, const std::string& source, const Keys& keys, bool* out);
Status read_string(const nlohmann::json& config, const std::string& source, const Keys& keys, std::string* out);

}  // namespace tessera::config_fields
