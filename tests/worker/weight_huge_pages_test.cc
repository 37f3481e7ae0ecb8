// model.weights_huge_pages after_start on a real model (common/huge_pages.h): the weights
// load on 4 KiB pages, a mover puts them on 2 MiB ones while the model runs, and the model's
// tokens are its goldens' all along.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "worker/generator.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

TEST(WeightHugePages, AfterStartMovesTheWeightsWhileTheModelGivesItsGoldens) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/kjv-llama";
  std::ifstream in(dir + "/goldens/index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  for (const WeightHugePages when : {WeightHugePages::kLoad, WeightHugePages::kAfterStart}) {
    ModelLoadOptions lo;
    lo.dtype = DType::kF32;
    lo.huge_pages = when;
    auto model = Transformer::load(dir, lo, **backend);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const HugePageMover* mover = (*model)->huge_page_mover();
    EXPECT_EQ(mover != nullptr, when == WeightHugePages::kAfterStart) << weight_huge_pages_name(when);
    // Generated at once, while the mover may be moving the weights under the model.
    Generator gen(**model, **backend);
    for (const auto& c : index["cases"]) {
      GenerationRequest r;
      r.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
      const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
      r.max_new_tokens = static_cast<int>(want.size());
      auto out = gen.generate({r}, false);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ(out.value()[0].output, want) << c["name"] << ", " << weight_huge_pages_name(when);
    }
    if (mover != nullptr) {
      for (int i = 0; i < 2000 && !mover->finished(); ++i) usleep(5000);
      EXPECT_TRUE(mover->finished()) << "the move took over 10 s";
    }
  }
}

}  // namespace
}  // namespace tessera
