// tessera-make-checkpoint --lora-of (tools/lib/random_lora.h) run as a user runs it: the adapter
// it writes for a model of each kind of layer layout (separate projections, biases in the base,
// fused QKV and gate_up, routed experts, GPT-2's Conv1D) loads back through the PEFT reader
// (worker/lora_adapter.h) with every targeted linear layer of the base adapted at the rank asked
// for; targets that name nothing and flags that belong elsewhere are refused by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/checkpoint.h"
#include "tests/test_support.h"
#include "worker/lora_adapter.h"
#include "worker/model_config.h"

namespace tessera {
namespace {

using ::tessera::testing::run_command;

struct Written {
  testing::CommandResult run;
  std::string dir;
};

Written make_lora(const std::string& fixture, const std::string& flags) {
  Written w;
  w.dir = testing::make_temp_dir("tessera-random-lora") + "/adapter";
  w.run = run_command(testing::bin_dir() + "/tessera-make-checkpoint --lora-of '" + testing::fixtures_dir() + "/" +
                      fixture + "' --out '" + w.dir + "' " + flags);
  return w;
}

TEST(RandomLora, EachLayoutsAdapterLoadsBackWithEveryTargetedLayer) {
  TESSERA_REQUIRE_FIXTURES();
  for (const char* fixture : {"tiny-llama", "tiny-qwen2", "tiny-phi3", "tiny-mixtral", "tiny-gpt2"}) {
    const Written w = make_lora(fixture, "--lora-rank 4 --lora-alpha 8 --dtype bfloat16 --seed 3");
    ASSERT_EQ(w.run.exit_code, 0) << fixture << ": " << w.run.err;
    auto base = Checkpoint::open(testing::fixtures_dir() + "/" + fixture);
    ASSERT_TRUE(base.is_ok());
    auto config = parse_model_config(base.value()->config(), base.value()->config_source());
    ASSERT_TRUE(config.is_ok());
    auto adapter = load_lora_adapter(w.dir, *base.value(), config.value(), 16);
    ASSERT_TRUE(adapter.is_ok()) << fixture << ": " << adapter.status().to_string();
    const std::vector<LoraTargetModule> all = lora_target_modules(*base.value(), config.value());
    ASSERT_FALSE(all.empty()) << fixture;
    ASSERT_EQ(adapter->modules.size(), all.size()) << fixture << ": all-linear adapts every linear layer";
    EXPECT_EQ(adapter->config.rank, 4);
    EXPECT_DOUBLE_EQ(adapter->config.scale(), 2.0);
    for (const LoraModule& m : adapter->modules) {
      EXPECT_EQ(m.a.dim(0), 4) << m.target.name;
      EXPECT_EQ(m.b.dim(0), m.target.out) << m.target.name;
      float largest = 0;
      const auto* b = static_cast<const float*>(m.b.view().data);
      for (int64_t i = 0; i < m.b.view().numel(); ++i) largest = std::max(largest, std::abs(b[i]));
      EXPECT_GT(largest, 0.0f) << m.target.name << ": B is not zero, so the adapter changes the logits";
    }
  }
}

TEST(RandomLora, NamedTargetsAdaptOnlyThoseLayers) {
  TESSERA_REQUIRE_FIXTURES();
  const Written w = make_lora("tiny-llama", "--lora-rank 2 --lora-targets q_proj,v_proj --lora-rslora");
  ASSERT_EQ(w.run.exit_code, 0) << w.run.err;
  auto base = Checkpoint::open(testing::fixtures_dir() + "/tiny-llama");
  auto config = parse_model_config(base.value()->config(), base.value()->config_source());
  auto adapter = load_lora_adapter(w.dir, *base.value(), config.value(), 16);
  ASSERT_TRUE(adapter.is_ok()) << adapter.status().to_string();
  ASSERT_EQ(adapter->modules.size(), static_cast<size_t>(2 * config->layers));
  for (const LoraModule& m : adapter->modules)
    EXPECT_TRUE(m.target.role == TensorRole::kQ || m.target.role == TensorRole::kV) << m.target.name;
  EXPECT_TRUE(adapter->config.rslora);
}

TEST(RandomLora, TargetsThatNameNothingAndStrayFlagsAreRefused) {
  TESSERA_REQUIRE_FIXTURES();
  const Written none = make_lora("tiny-llama", "--lora-targets c_attn");
  EXPECT_EQ(none.run.exit_code, 1);
  EXPECT_NE(none.run.err.find("--lora-targets: no linear layer of"), std::string::npos) << none.run.err;
  EXPECT_NE(none.run.err.find("(llama) is named by [\"c_attn\"]"), std::string::npos) << none.run.err;
  const Written stray = make_lora("tiny-llama", "--layers 4");
  EXPECT_EQ(stray.run.exit_code, 2);
  EXPECT_NE(stray.run.err.find("--layers does not apply to --lora-of"), std::string::npos) << stray.run.err;
  const std::string dir = testing::make_temp_dir("tessera-random-lora");
  const auto without = run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --lora-rank 4 --out '" +
                                   dir + "/m'");
  EXPECT_EQ(without.exit_code, 2);
  EXPECT_NE(without.err.find("--lora-rank applies only to --lora-of"), std::string::npos) << without.err;
}

}  // namespace
}  // namespace tessera
