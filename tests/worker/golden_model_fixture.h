#pragma once
// A fixture model on the CPU backend with its goldens' prompt and greedy ids
// (goldens/index.json), for the engine-level tests that run them through Engine + Scheduler +
// Executor. Parameterised by the fixture folder's name (testing::golden_models()). The same
// prompts as Generator requests for the tests that run a Transformer directly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/generator.h"
#include "worker/transformer.h"

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

// The goldens' prompts as requests for Generator, each for as many tokens as its greedy ids.
inline std::vector<GenerationRequest> golden_generation_requests(const std::string& model_dir) {
  std::vector<GenerationRequest> reqs;
  for (const GoldenIds& c : read_golden_ids(model_dir)) {
    GenerationRequest r;
    r.prompt = c.prompt;
    r.max_new_tokens = static_cast<int>(c.greedy.size());
    reqs.push_back(r);
  }
  return reqs;
}

class GoldenModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto b = make_backend("cpu");
    ASSERT_TRUE(b.is_ok());
    backend_ = std::move(b).value();
    auto m = Transformer::load(fixtures_dir() + "/" + GetParam(), ModelLoadOptions{}, *backend_);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(m).value();
    cases_ = read_golden_ids(fixtures_dir() + "/" + GetParam());
  }

  // KV blocks for every case at full length at once, each with `extra_tokens` more.
  int blocks_for_all(int block_size, int extra_tokens = 0) const {
    int n = 0;
    for (const GoldenIds& c : cases_)
      n += static_cast<int>((c.prompt.size() + c.greedy.size() + extra_tokens + block_size - 1) / block_size);
    return n;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> model_;
  std::vector<GoldenIds> cases_;
};

}  // namespace tessera::testing
