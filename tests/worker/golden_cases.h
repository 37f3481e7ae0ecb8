#pragma once
// The prompt ids and greedy ids of a fixture model's goldens (goldens/index.json), for the
// engine-level tests that run them through Engine + Scheduler + Executor.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace tessera::testing {

struct GoldenIds {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

inline std::vector<GoldenIds> read_golden_ids(const std::string& model_dir) {
  std::ifstream in(model_dir + "/goldens/index.json");
  const auto index = nlohmann::json::parse(in);
  std::vector<GoldenIds> cases;
  for (const auto& c : index["cases"]) {
    cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>()});
  }
  return cases;
}

}  // namespace tessera::testing
