#pragma once
// The goldens' prompts as tessera-generate reads them: a --prompt-ids-file with one
// comma-separated id list per line, in the order of goldens/index.json's "cases".
#include <nlohmann/json.hpp>

#include <string>

#include "tests/test_support.h"

namespace tessera::testing {

inline void write_golden_prompts(const nlohmann::json& cases, const std::string& path) {
  std::string lines;
  for (const auto& c : cases) {
    std::string ids;
    for (const auto& id : c["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
    lines += ids + "\n";
  }
  write_file(path, lines);
}

}  // namespace tessera::testing
