// The built-in auto-TP policy of every family, on the fixtures' real tensor names (read from
// their safetensors): DeepSpeed AutoTP's choices (all-reduce after o_proj / down_proj /
// dense / c_proj / dense_4h_to_h / w2, routers and gates whole, fused QKV and gate|up split
// column-wise, embeddings and LM head by vocabulary), and the same overrides as for the
// first families: injection_policy with each family's Hugging Face block, DeepSpeed's
// environment variables.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <set>

#include "common/checkpoint.h"
#include "common/config.h"
#include "tests/test_support.h"
#include "worker/arch_tensors.h"
#include "worker/auto_tp.h"

namespace tessera {
namespace {

struct Fixture {
  ModelConfig config;
  std::vector<std::string> names;  // as the checkpoint holds them
};

Fixture load(const std::string& model) {
  Fixture f;
  auto ckpt = Checkpoint::open(testing::fixtures_dir() + "/" + model);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  if (!ckpt.is_ok()) return f;
  auto c = parse_model_config(ckpt.value()->config(), model);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (c.is_ok()) f.config = c.value();
  f.names = ckpt.value()->tensor_names();
  return f;
}

AutoTpOptions yaml_options(const std::string& yaml, bool use_env = false) {
  auto cfg = parse_config_yaml(yaml, "tp.yaml");
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  return auto_tp_options_from(cfg.value(), use_env);
}

// The role DeepSpeed's AutoTP gives a tensor of each kind.
TpRole deepspeed_role(TensorRole r) {
  switch (r) {
    case TensorRole::kEmbed:
    case TensorRole::kLmHead: return TpRole::kVocab;
    case TensorRole::kQ:
    case TensorRole::kK:
    case TensorRole::kV:
    case TensorRole::kQkv:
    case TensorRole::kGate:
    case TensorRole::kUp:
    case TensorRole::kGateUp:
    case TensorRole::kExpertGate:
    case TensorRole::kExpertUp:
    case TensorRole::kSharedGate:
    case TensorRole::kSharedUp: return TpRole::kColumn;
    case TensorRole::kO:
    case TensorRole::kDown:
    case TensorRole::kExpertDown:
    case TensorRole::kSharedDown: return TpRole::kRow;
    default: return TpRole::kKeep;
  }
}

class FamilyPlanTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyPlanTest, EveryTensorGetsDeepSpeedsRoleAndTheLoaderAgrees) {
  TESSERA_REQUIRE_FIXTURES();
  const Fixture f = load(GetParam());
  ASSERT_FALSE(f.names.empty());
  auto plan = plan_tensor_parallel(f.config, f.names, AutoTpOptions{}, 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  // The checkpoint holds exactly the tensors the table implies, and each has its role.
  std::set<std::string> expected;
  for (const ExpectedTensor& t : expected_tensors(f.config)) {
    expected.insert(t.name);
    const TpRole want = t.kind == ExpectedTensor::Kind::kMatrix ? deepspeed_role(t.role) : TpRole::kKeep;
    const TpRole got = plan->role_of(t.name);
    if (t.kind == ExpectedTensor::Kind::kBias && (got == TpRole::kColumn || got == TpRole::kRow)) {
      EXPECT_EQ(got, deepspeed_role(t.role)) << t.name << ": a bias follows its weight";
      continue;
    }
    if (t.kind == ExpectedTensor::Kind::kBias) continue;  // a norm's bias: kept
    EXPECT_EQ(got, want) << t.name << " (" << tensor_role_name(t.role) << ") is " << tp_role_name(got);
  }
  EXPECT_EQ(expected, std::set<std::string>(f.names.begin(), f.names.end()));
  // The printed plan names every tensor and gives fused tensors their per-rank rows.
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ExpectedTensor& t : expected_tensors(f.config)) shapes[t.name] = t.shape;
  ASSERT_TRUE(check_tp_plan_shapes(plan.value(), f.config, shapes).is_ok());
  const std::string table = format_tp_plan(plan.value(), f.config, shapes);
  for (const std::string& n : f.names) EXPECT_NE(table.find(n + " "), std::string::npos) << n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyPlanTest, ::testing::ValuesIn(testing::tiny_models()),
                         [](const auto& info) {
                           std::string m = info.param;
                           for (char& ch : m) if (ch == '-') ch = '_';
                           return m;
                         });

TEST(FamilyPlanTest, RowParallelLinearsAreTheOnesDeepSpeedAllReduces) {
  TESSERA_REQUIRE_FIXTURES();
  // Per family, the suffixes DeepSpeed's AutoTP all-reduces after (its all_reduce_linears).
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {"tiny-falcon", {"self_attention.dense.weight", "mlp.dense_4h_to_h.weight"}},
      {"tiny-gpt-neox", {"attention.dense.weight", "mlp.dense_4h_to_h.weight"}},
      {"tiny-gpt2", {"attn.c_proj.weight", "mlp.c_proj.weight"}},
      {"tiny-starcoder2", {"self_attn.o_proj.weight", "mlp.c_proj.weight"}},
      {"tiny-phi3", {"self_attn.o_proj.weight", "mlp.down_proj.weight"}},
      {"tiny-gemma2", {"self_attn.o_proj.weight", "mlp.down_proj.weight"}},
      {"tiny-qwen2-moe", {"self_attn.o_proj.weight", "down_proj.weight"}},  // every expert's and the shared one
  };
  for (const auto& [model, suffixes] : rows) {
    const Fixture f = load(model);
    const TpPlan plan = plan_tensor_parallel(f.config, f.names, AutoTpOptions{}, 2).value();
    std::set<std::string> row;
    for (const auto& [name, role] : plan.roles) {
      if (role == TpRole::kRow && name.ends_with(".weight")) row.insert(name);
    }
    for (const std::string& name : row) {
      bool listed = false;
      for (const std::string& s : suffixes) listed |= name.ends_with(s);
      EXPECT_TRUE(listed) << model << ": " << name << " is row-parallel";
    }
    for (const std::string& s : suffixes) {
      bool found = false;
      for (const std::string& name : row) found |= name.ends_with(s);
      EXPECT_TRUE(found) << model << ": no row-parallel tensor ends in " << s;
    }
  }
  const Fixture moe = load("tiny-qwen2-moe");
  const TpPlan plan = plan_tensor_parallel(moe.config, moe.names, AutoTpOptions{}, 2).value();
  EXPECT_EQ(plan.role_of("model.layers.0.mlp.gate.weight"), TpRole::kKeep);
  EXPECT_EQ(plan.role_of("model.layers.0.mlp.shared_expert_gate.weight"), TpRole::kKeep);
}

TEST(FamilyPlanTest, InjectionPolicyNamesTheFamilysOwnBlock) {
  TESSERA_REQUIRE_FIXTURES();
  const Fixture gpt2 = load("tiny-gpt2");
  const TpPlan builtin = plan_tensor_parallel(gpt2.config, gpt2.names, AutoTpOptions{}, 2).value();
  auto policy = plan_tensor_parallel(
      gpt2.config, gpt2.names, yaml_options("parallel: {injection_policy: {GPT2Block: [attn.c_proj, mlp.c_proj]}}"), 2);
  ASSERT_TRUE(policy.is_ok()) << policy.status().to_string();
  EXPECT_EQ(policy->roles, builtin.roles);
  // Naming only the attention's output makes the MLP's c_proj column-parallel, which the
  // loader then refuses by name (a column output cannot follow a column input).
  auto half = plan_tensor_parallel(gpt2.config, gpt2.names,
                                   yaml_options("parallel: {injection_policy: {GPT2Block: [attn.c_proj]}}"), 2);
  ASSERT_TRUE(half.is_ok());
  EXPECT_EQ(half->role_of("transformer.h.0.mlp.c_proj.weight"), TpRole::kColumn);

  const Fixture qwen = load("tiny-qwen2");
  auto wrong = plan_tensor_parallel(qwen.config, qwen.names,
                                    yaml_options("parallel: {injection_policy: {LlamaDecoderLayer: [o_proj]}}"), 2);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("Qwen2DecoderLayer"), std::string::npos) << wrong.status().message();
  auto right = plan_tensor_parallel(
      qwen.config, qwen.names, yaml_options("parallel: {injection_policy: {Qwen2DecoderLayer: [o_proj, down_proj]}}"), 2);
  ASSERT_TRUE(right.is_ok()) << right.status().to_string();
  EXPECT_EQ(right->roles, plan_tensor_parallel(qwen.config, qwen.names, AutoTpOptions{}, 2).value().roles);
}

TEST(FamilyPlanTest, DeepSpeedKeepListKeepsFalconsMlpOutputWhole) {
  TESSERA_REQUIRE_FIXTURES();
  const Fixture f = load("tiny-falcon");
  ::setenv("DS_KEEP_LINEAR_ITEMS", "{'dense_4h_to_h':'falcon'}", 1);
  auto plan = plan_tensor_parallel(f.config, f.names, yaml_options("", /*use_env=*/true), 2);
  ::unsetenv("DS_KEEP_LINEAR_ITEMS");
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->role_of("transformer.h.1.mlp.dense_4h_to_h.weight"), TpRole::kKeep);
  EXPECT_EQ(plan->role_of("transformer.h.1.self_attention.dense.weight"), TpRole::kRow);
}

}  // namespace
}  // namespace tessera
