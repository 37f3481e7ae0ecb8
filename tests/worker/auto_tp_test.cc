#include "worker/auto_tp.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tests/test_support.h"

namespace tessera {
namespace {

ModelConfig load_fixture_config(const std::string& name) {
  const std::string path = tessera::testing::fixtures_dir() + "/" + name + "/config.json";
  auto c = parse_model_config(nlohmann::json::parse(tessera::testing::read_file(path)), path);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.value();
}

// Every weight (and BLOOM's biases) of a model with their checkpoint shapes, from the
// architecture table — the same names and shapes the fixtures' safetensors hold.
std::map<std::string, std::vector<int64_t>> model_shapes(const ModelConfig& c) {
  const int64_t hd = c.head_dim;
  auto shape_of = [&](TensorRole r) -> std::vector<int64_t> {
    switch (r) {
      case TensorRole::kEmbed:
      case TensorRole::kLmHead: return {c.vocab, c.hidden};
      case TensorRole::kQ: return {c.heads * hd, c.hidden};
      case TensorRole::kK:
      case TensorRole::kV: return {c.kv_heads * hd, c.hidden};
      case TensorRole::kQkv: return {c.heads * 3 * hd, c.hidden};
      case TensorRole::kO: return {c.hidden, c.heads * hd};
      case TensorRole::kGate:
      case TensorRole::kUp: return {c.ffn, c.hidden};
      case TensorRole::kDown: return {c.hidden, c.ffn};
      case TensorRole::kExpertGate:
      case TensorRole::kExpertUp: return {c.moe_ffn, c.hidden};
      case TensorRole::kExpertDown: return {c.hidden, c.moe_ffn};
      case TensorRole::kRouter: return {c.num_experts, c.hidden};
      default: return {c.hidden};  // norms
    }
  };
  const bool biases = c.arch->name == "bloom";
  std::map<std::string, std::vector<int64_t>> out;
  for (size_t i = 0; i < static_cast<size_t>(TensorRole::kCount); ++i) {
    const auto role = static_cast<TensorRole>(i);
    const std::string& pattern = c.arch->name_of(role);
    if (pattern.empty() || (role == TensorRole::kLmHead && c.tie_embeddings)) continue;
    const bool per_layer = pattern.find("{L}") != std::string::npos;
    const bool per_expert = pattern.find("{E}") != std::string::npos;
    for (int l = 0; l < (per_layer ? c.layers : 1); ++l) {
      for (int e = 0; e < (per_expert ? c.num_experts : 1); ++e) {
        const std::string name = tensor_name(pattern, l, per_expert ? e : -1);
        std::vector<int64_t> shape = shape_of(role);
        out[name] = shape;
        if (biases && role != TensorRole::kEmbed && role != TensorRole::kLmHead) out[bias_name(name)] = {shape[0]};
      }
    }
  }
  return out;
}

std::vector<std::string> names_of(const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : shapes) names.push_back(name);
  return names;
}

TpPlan plan_or_die(const ModelConfig& c, const AutoTpOptions& o, int world) {
  auto plan = plan_tensor_parallel(c, names_of(model_shapes(c)), o, world);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  return plan.is_ok() ? plan.value() : TpPlan{};
}

::testing::AssertionResult fails_with(const Status& st, const std::vector<std::string>& parts) {
  if (st.is_ok()) return ::testing::AssertionFailure() << "expected an error, got ok";
  for (const auto& p : parts) {
    if (st.message().find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << st.message();
    }
  }
  return ::testing::AssertionSuccess();
}

AutoTpOptions options_from_yaml(const std::string& yaml, bool use_env = false) {
  auto cfg = parse_config_yaml(yaml, "tp.yaml");
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  return auto_tp_options_from(cfg.value(), use_env);
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

const char* kMixW2 = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
const char* kMixW1 = "model.layers.1.block_sparse_moe.experts.3.w1.weight";
const char* kMixRouter = "model.layers.0.block_sparse_moe.gate.weight";

TEST(AutoTpTest, MixtralBuiltInPolicy) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");
  const TpPlan plan = plan_or_die(c, AutoTpOptions{}, 2);
  EXPECT_EQ(plan.world_size, 2);
  EXPECT_EQ(plan.roles.size(), model_shapes(c).size());
  EXPECT_EQ(plan.role_of(kMixW2), TpRole::kRow);
  EXPECT_EQ(plan.role_of(kMixW1), TpRole::kColumn);
  EXPECT_EQ(plan.role_of("model.layers.0.block_sparse_moe.experts.0.w3.weight"), TpRole::kColumn);
  EXPECT_EQ(plan.role_of(kMixRouter), TpRole::kKeep);
  EXPECT_EQ(plan.role_of("model.layers.0.self_attn.q_proj.weight"), TpRole::kColumn);
  EXPECT_EQ(plan.role_of("model.layers.0.self_attn.k_proj.weight"), TpRole::kColumn);
  EXPECT_EQ(plan.role_of("model.layers.0.self_attn.o_proj.weight"), TpRole::kRow);
  EXPECT_EQ(plan.role_of("model.embed_tokens.weight"), TpRole::kVocab);
  EXPECT_EQ(plan.role_of("lm_head.weight"), TpRole::kVocab);
  EXPECT_EQ(plan.role_of("model.norm.weight"), TpRole::kKeep);
  EXPECT_EQ(plan.role_of("model.layers.1.post_attention_layernorm.weight"), TpRole::kKeep);
  EXPECT_EQ(plan.role_of("not.in.the.plan"), TpRole::kKeep);
  EXPECT_STREQ(tp_role_name(TpRole::kVocab), "vocab");
}

TEST(AutoTpTest, KeepLinearFromYamlMovesW2) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");
  TpPlan plan = plan_or_die(c, options_from_yaml("parallel: {auto_tp: {keep_linear: {w2: mixtral}}}"), 2);
  EXPECT_EQ(plan.role_of(kMixW2), TpRole::kKeep);
  EXPECT_EQ(plan.role_of(kMixW1), TpRole::kColumn);
  // Another model_type's entry does not apply; nor does a name that is not a suffix at a '.'.
  plan = plan_or_die(c, options_from_yaml("parallel: {auto_tp: {keep_linear: {w2: llama, proj: mixtral}}}"), 2);
  EXPECT_EQ(plan.role_of(kMixW2), TpRole::kRow);
  EXPECT_EQ(plan.role_of("model.layers.0.self_attn.q_proj.weight"), TpRole::kColumn);
  // A dotted suffix works, and all_reduce_linear makes a linear row.
  plan = plan_or_die(c, options_from_yaml("parallel: {auto_tp: {all_reduce_linear: {self_attn.q_proj: MIXTRAL}}}"), 2);
  EXPECT_EQ(plan.role_of("model.layers.1.self_attn.q_proj.weight"), TpRole::kRow);
  // keep_linear wins over all_reduce_linear for the same linear (as in DeepSpeed).
  plan = plan_or_die(
      c, options_from_yaml("parallel: {auto_tp: {all_reduce_linear: {gate: mixtral}, keep_linear: {gate: mixtral}}}"), 2);
  EXPECT_EQ(plan.role_of(kMixRouter), TpRole::kKeep);
  plan = plan_or_die(c, options_from_yaml("parallel: {auto_tp: {all_reduce_linear: {gate: mixtral}}}"), 2);
  EXPECT_EQ(plan.role_of(kMixRouter), TpRole::kRow);
}

TEST(AutoTpTest, KeepLinearFromEnvironmentMovesW2) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");
  {
    ScopedEnv env("DS_KEEP_LINEAR_ITEMS", "{'w2':'mixtral'}");
    const AutoTpOptions o = options_from_yaml("parallel: {auto_tp: {keep_linear: {w2: llama}}}", /*use_env=*/true);
    EXPECT_EQ(o.keep_linear.at("w2"), "mixtral");  // the environment wins over the YAML
    EXPECT_EQ(plan_or_die(c, o, 2).role_of(kMixW2), TpRole::kKeep);
    // use_env = false ignores it.
    EXPECT_EQ(plan_or_die(c, options_from_yaml("", false), 2).role_of(kMixW2), TpRole::kRow);
  }
  {
    ScopedEnv env("DS_ALL_REDUCE_LINEAR_ITEMS", "{ \"q_proj\" : \"mixtral\" , }");
    EXPECT_EQ(plan_or_die(c, options_from_yaml("", true), 2).role_of("model.layers.0.self_attn.q_proj.weight"),
              TpRole::kRow);
  }
  {
    ScopedEnv env("DS_KEEP_LINEAR_ITEMS", "w2:mixtral");
    const AutoTpOptions o = options_from_yaml("", true);
    auto plan = plan_tensor_parallel(c, names_of(model_shapes(c)), o, 2);
    EXPECT_TRUE(fails_with(plan.status(), {"DS_KEEP_LINEAR_ITEMS", "w2:mixtral", "expected '{'"}));
  }
}

TEST(AutoTpTest, ParseDsEnvItems) {
  std::map<std::string, std::string> m;
  ASSERT_TRUE(parse_ds_env_items("V", "{'w2':'mixtral'}", &m).is_ok());
  EXPECT_EQ(m, (std::map<std::string, std::string>{{"w2", "mixtral"}}));
  m.clear();
  ASSERT_TRUE(parse_ds_env_items("V", "  { \"w2\" : 'mixtral',  'gate':\"mixtral\", }  ", &m).is_ok());
  EXPECT_EQ(m, (std::map<std::string, std::string>{{"gate", "mixtral"}, {"w2", "mixtral"}}));
  m.clear();
  ASSERT_TRUE(parse_ds_env_items("V", nullptr, &m).is_ok());
  ASSERT_TRUE(parse_ds_env_items("V", "", &m).is_ok());
  ASSERT_TRUE(parse_ds_env_items("V", "{}", &m).is_ok());
  EXPECT_TRUE(m.empty());
  EXPECT_TRUE(fails_with(parse_ds_env_items("DS_KEEP_LINEAR_ITEMS", "{'w2' 'mixtral'}", &m),
                         {"DS_KEEP_LINEAR_ITEMS", "expected ':'", "{'w2':'mixtral'}"}));
  EXPECT_TRUE(fails_with(parse_ds_env_items("DS_X", "{'w2':'mixtral'", &m), {"DS_X", "expected ',' or '}'"}));
  EXPECT_TRUE(fails_with(parse_ds_env_items("DS_X", "{w2:'mixtral'}", &m), {"DS_X", "quoted string"}));
  EXPECT_TRUE(fails_with(parse_ds_env_items("DS_X", "{'w2:'mixtral'}", &m), {"DS_X"}));
  EXPECT_TRUE(fails_with(parse_ds_env_items("DS_X", "{'w2':'mixtral'} x", &m), {"DS_X", "after '}'"}));
  EXPECT_TRUE(fails_with(parse_ds_env_items("DS_X", "{'':'mixtral'}", &m), {"DS_X", "empty string"}));
  EXPECT_TRUE(m.empty());  // failures add nothing
}

TEST(AutoTpTest, BloomInjectionPolicy) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-bloom");
  const TpPlan builtin = plan_or_die(c, AutoTpOptions{}, 2);
  const TpPlan plan = plan_or_die(
      c, options_from_yaml("parallel: {injection_policy: {BloomBlock: [self_attention.dense, mlp.dense_4h_to_h]}}"), 2);
  for (const TpPlan* p : {&builtin, &plan}) {
    EXPECT_EQ(p->role_of("transformer.h.2.self_attention.dense.weight"), TpRole::kRow);
    EXPECT_EQ(p->role_of("transformer.h.2.self_attention.dense.bias"), TpRole::kRow);
    EXPECT_EQ(p->role_of("transformer.h.2.mlp.dense_4h_to_h.weight"), TpRole::kRow);
    EXPECT_EQ(p->role_of("transformer.h.2.self_attention.query_key_value.weight"), TpRole::kColumn);
    EXPECT_EQ(p->role_of("transformer.h.2.self_attention.query_key_value.bias"), TpRole::kColumn);
    EXPECT_EQ(p->role_of("transformer.h.2.mlp.dense_h_to_4h.weight"), TpRole::kColumn);
    EXPECT_EQ(p->role_of("transformer.h.2.input_layernorm.weight"), TpRole::kKeep);
    EXPECT_EQ(p->role_of("transformer.word_embeddings.weight"), TpRole::kVocab);
    EXPECT_EQ(p->role_of("transformer.word_embeddings_layernorm.bias"), TpRole::kKeep);
  }
  // The policy decides for the whole block: only the listed linears are row.
  const TpPlan only_mlp = plan_or_die(c, options_from_yaml("parallel: {injection_policy: {BloomBlock: [dense_4h_to_h]}}"), 2);
  EXPECT_EQ(only_mlp.role_of("transformer.h.0.self_attention.dense.weight"), TpRole::kColumn);
  EXPECT_EQ(only_mlp.role_of("transformer.h.0.mlp.dense_4h_to_h.weight"), TpRole::kRow);

  auto names = names_of(model_shapes(c));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(c, names, options_from_yaml(
                             "parallel: {injection_policy: {LlamaDecoderLayer: [o_proj]}}"), 2).status(),
                         {"LlamaDecoderLayer", "not a block of model_type bloom", "BloomBlock"}));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(c, names, options_from_yaml(
                             "parallel: {injection_policy: {BloomBlock: [self_attention.dens]}}"), 2).status(),
                         {"parallel.injection_policy.BloomBlock", "'self_attention.dens' names no linear"}));
}

TEST(AutoTpTest, RulesHaveHighestPrecedenceAndFirstMatchWins) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");
  TpPlan plan = plan_or_die(c, options_from_yaml(R"(
parallel:
  auto_tp:
    keep_linear: {w2: mixtral}
    rules:
      - {match: 'layers\.0\..*w2', role: keep}
      - {match: 'experts\.\d+\.w2', role: row}
      - {match: 'w2', role: column}
      - {match: '^lm_head', role: keep}
      - {match: 'embed_tokens', role: column}
)"), 2);
  EXPECT_EQ(plan.role_of("model.layers.0.block_sparse_moe.experts.2.w2.weight"), TpRole::kKeep);
  EXPECT_EQ(plan.role_of(kMixW2), TpRole::kRow);  // the rule beats keep_linear
  EXPECT_EQ(plan.role_of("lm_head.weight"), TpRole::kKeep);
  EXPECT_EQ(plan.role_of("model.embed_tokens.weight"), TpRole::kVocab);  // column on an embedding = vocab rows

  auto names = names_of(model_shapes(c));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(c, names, options_from_yaml(
                             "parallel: {auto_tp: {rules: [{match: 'norm', role: column}]}}"), 2).status(),
                         {"parallel.auto_tp.rules[0]", "is a norm", "keep"}));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(c, names, options_from_yaml(
                             "parallel: {auto_tp: {rules: [{match: 'lm_head', role: row}]}}"), 2).status(),
                         {"lm_head.weight", "embedding"}));
}

TEST(AutoTpTest, RulesArePcre2RegexesAndBadOnesNameTheRule) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");
  // A lookahead (PCRE2, not ECMAScript-only syntax): every w2 but expert 3's is kept.
  TpPlan plan = plan_or_die(c, options_from_yaml(R"(
parallel: {auto_tp: {rules: [{match: 'experts\.(?!3\.)\d+\.w2', role: keep}]}}
)"), 2);
  EXPECT_EQ(plan.role_of("model.layers.1.block_sparse_moe.experts.2.w2.weight"), TpRole::kKeep);
  EXPECT_EQ(plan.role_of(kMixW2), TpRole::kRow);  // expert 3: the built-in policy

  // Rules built in code (not read from YAML) are compiled by the planner, errors naming them.
  AutoTpOptions coded;
  coded.rules.resize(2);
  coded.rules[0].match = "lm_head";
  coded.rules[1].match = "experts\\.(";
  coded.rules[1].role = TpRole::kRow;
  EXPECT_TRUE(fails_with(plan_tensor_parallel(c, names_of(model_shapes(c)), coded, 2).status(),
                         {"parallel.auto_tp.rules[1].match", "invalid regular expression", "missing closing parenthesis"}));
}

TEST(AutoTpTest, UnevenSplitsNameLayerAndSizes) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig llama = load_fixture_config("tiny-llama");  // heads 4, kv 2, ffn 344
  auto names = names_of(model_shapes(llama));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(llama, {"model.layers.1.mlp.down_proj.weight"}, {}, 3).status(),
                         {"model.layers.1.mlp.down_proj.weight (layer 1)", "row split needs intermediate_size 344",
                          "tensor_parallel 3"}));
  // KV heads follow the query heads (shared KV heads are replicated), so v_proj alone plans
  // at any size; the query heads decide.
  EXPECT_TRUE(plan_tensor_parallel(llama, {"model.layers.0.self_attn.v_proj.weight"}, {}, 3).is_ok());
  EXPECT_EQ(kv_heads_for_rank(6, 3, 1, 2).first, 1);
  EXPECT_EQ(kv_heads_for_rank(6, 3, 1, 2).count, 2);
  EXPECT_EQ(kv_heads_for_rank(8, 2, 3, 4).first, 1);
  EXPECT_EQ(kv_heads_for_rank(8, 2, 3, 4).count, 1);
  // The whole model at TP 3: the first tensor in name order that does not divide (the
  // vocabulary may split unevenly; the MLP may not).
  EXPECT_TRUE(fails_with(plan_tensor_parallel(llama, names, {}, 3).status(), {"intermediate_size 344"}));
  // TP 8 > 4 heads.
  EXPECT_TRUE(fails_with(plan_tensor_parallel(llama, names, {}, 8).status(), {"num_attention_heads 4", "tensor_parallel 8"}));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(llama, {"model.layers.2.self_attn.q_proj.weight"}, {}, 3).status(),
                         {"model.layers.2.self_attn.q_proj.weight (layer 2)", "num_attention_heads 4",
                          "tensor_parallel 3"}));
  // Keeping the MLP whole makes TP 4 plannable (kv heads then replicated).
  EXPECT_TRUE(plan_tensor_parallel(llama, names, {}, 4).is_ok());

  const ModelConfig bloom = load_fixture_config("tiny-bloom");  // heads 6, vocab 1024
  EXPECT_TRUE(fails_with(plan_tensor_parallel(bloom, names_of(model_shapes(bloom)), {}, 4).status(),
                         {"(layer 0)", "num_attention_heads 6", "tensor_parallel 4"}));
  EXPECT_TRUE(fails_with(plan_tensor_parallel(bloom, {"transformer.h.2.self_attention.query_key_value.weight"}, {}, 4)
                             .status(),
                         {"query_key_value.weight (layer 2): column split needs num_attention_heads 6"}));
  // 1024 rows over 3 ranks: 342, 342, 340 (ceil-sized chunks, padded for the all-gather).
  auto uneven = plan_tensor_parallel(bloom, names_of(model_shapes(bloom)), {}, 3);
  ASSERT_TRUE(uneven.is_ok()) << uneven.status().to_string();
  EXPECT_EQ(slice_for(uneven.value(), bloom, "transformer.word_embeddings.weight", {1024, 96}, 2).count, 340);
  EXPECT_EQ(slice_for(uneven.value(), bloom, "transformer.word_embeddings.weight", {1024, 96}, 1).begin, 342);
  EXPECT_TRUE(plan_tensor_parallel(bloom, names_of(model_shapes(bloom)),
                                   options_from_yaml("parallel: {auto_tp: {rules: [{match: word_embeddings\\.weight, "
                                                     "role: keep}]}}"), 3).is_ok());
  EXPECT_TRUE(fails_with(plan_tensor_parallel(bloom, {}, {}, 0).status(), {"tensor_parallel must be >= 1"}));
}

TEST(AutoTpTest, SliceForGqaWithMoreRanksThanKvHeads) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");  // heads 4, kv 2, head_dim 16, ffn 128
  const auto shapes = model_shapes(c);
  const TpPlan plan = plan_or_die(c, AutoTpOptions{}, 4);
  ASSERT_TRUE(check_tp_plan_shapes(plan, c, shapes).is_ok());
  auto s = [&](const std::string& name, int rank) { return slice_for(plan, c, name, shapes.at(name), rank); };
  for (int r = 0; r < 4; ++r) {
    // rank r holds q head r and kv head r / 2.
    EXPECT_EQ(s("model.layers.0.self_attn.q_proj.weight", r), (TpSlice{0, 16 * r, 16}));
    EXPECT_EQ(s("model.layers.0.self_attn.k_proj.weight", r), (TpSlice{0, 16 * (r / 2), 16}));
    EXPECT_EQ(s("model.layers.1.self_attn.v_proj.weight", r), (TpSlice{0, 16 * (r / 2), 16}));
    EXPECT_EQ(s("model.layers.0.self_attn.o_proj.weight", r), (TpSlice{1, 16 * r, 16}));
    EXPECT_EQ(s(kMixW1, r), (TpSlice{0, 32 * r, 32}));
    EXPECT_EQ(s("model.layers.0.block_sparse_moe.experts.1.w3.weight", r), (TpSlice{0, 32 * r, 32}));
    EXPECT_EQ(s(kMixW2, r), (TpSlice{1, 32 * r, 32}));
    EXPECT_TRUE(s(kMixRouter, r).whole());
    EXPECT_TRUE(s("model.norm.weight", r).whole());
    EXPECT_EQ(s("model.embed_tokens.weight", r), (TpSlice{0, 128 * r, 128}));
    EXPECT_EQ(s("lm_head.weight", r), (TpSlice{0, 128 * r, 128}));
  }
  // TP 2: kv heads split, one per rank.
  const TpPlan plan2 = plan_or_die(c, AutoTpOptions{}, 2);
  EXPECT_EQ(slice_for(plan2, c, "model.layers.0.self_attn.k_proj.weight", {32, 64}, 1), (TpSlice{0, 16, 16}));
  // TP 1: everything whole.
  const TpPlan plan1 = plan_or_die(c, AutoTpOptions{}, 1);
  EXPECT_TRUE(slice_for(plan1, c, kMixW2, {64, 128}, 0).whole());
}

TEST(AutoTpTest, SliceForBloomFusedQkvAndVocab) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-bloom");  // heads 6, head_dim 16, hidden 96
  const auto shapes = model_shapes(c);
  const TpPlan plan = plan_or_die(c, AutoTpOptions{}, 2);
  ASSERT_TRUE(check_tp_plan_shapes(plan, c, shapes).is_ok());
  auto s = [&](const TpPlan& p, const std::string& name, int rank) { return slice_for(p, c, name, shapes.at(name), rank); };
  // [heads, 3, head_dim] rows: rank 1 holds heads 3..5 = rows 144..287.
  EXPECT_EQ(s(plan, "transformer.h.0.self_attention.query_key_value.weight", 1), (TpSlice{0, 144, 144}));
  EXPECT_EQ(s(plan, "transformer.h.0.self_attention.query_key_value.bias", 1), (TpSlice{0, 144, 144}));
  EXPECT_EQ(s(plan, "transformer.h.0.self_attention.dense.weight", 1), (TpSlice{1, 48, 48}));
  EXPECT_TRUE(s(plan, "transformer.h.0.self_attention.dense.bias", 1).whole());
  EXPECT_EQ(s(plan, "transformer.h.1.mlp.dense_h_to_4h.weight", 0), (TpSlice{0, 0, 192}));
  EXPECT_EQ(s(plan, "transformer.h.1.mlp.dense_h_to_4h.bias", 1), (TpSlice{0, 192, 192}));
  EXPECT_EQ(s(plan, "transformer.h.1.mlp.dense_4h_to_h.weight", 1), (TpSlice{1, 192, 192}));
  EXPECT_EQ(s(plan, "transformer.word_embeddings.weight", 1), (TpSlice{0, 512, 512}));
  EXPECT_TRUE(s(plan, "transformer.word_embeddings_layernorm.weight", 1).whole());
  // TP 3 (vocab replicated by a rule): rank 2 holds heads 4..5 = rows 192..287.
  const TpPlan plan3 = plan_or_die(
      c, options_from_yaml("parallel: {auto_tp: {rules: [{match: word_embeddings\\.weight, role: keep}]}}"), 3);
  EXPECT_EQ(s(plan3, "transformer.h.0.self_attention.query_key_value.weight", 2), (TpSlice{0, 192, 96}));
  EXPECT_TRUE(s(plan3, "transformer.word_embeddings.weight", 2).whole());
}

TEST(AutoTpTest, CheckShapesCatchesTensorsTheTableDoesNotKnow) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-llama");
  auto shapes = model_shapes(c);
  shapes["model.layers.0.mlp.extra_proj.weight"] = {10, 128};
  // The table knows nothing of extra_proj, so only its real shape can be checked.
  auto plan = plan_tensor_parallel(c, names_of(shapes), options_from_yaml(
                                  "parallel: {auto_tp: {rules: [{match: extra_proj, role: column}]}}"), 2);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->role_of("model.layers.0.mlp.extra_proj.weight"), TpRole::kColumn);
  EXPECT_TRUE(check_tp_plan_shapes(*plan, c, shapes).is_ok());
  shapes["model.layers.0.mlp.extra_proj.weight"] = {11, 128};
  EXPECT_TRUE(fails_with(check_tp_plan_shapes(*plan, c, shapes),
                         {"model.layers.0.mlp.extra_proj.weight (layer 0)", "size 11", "tensor_parallel 2"}));
}

TEST(AutoTpTest, FormatTpPlanTable) {
  TESSERA_REQUIRE_FIXTURES();
  const ModelConfig c = load_fixture_config("tiny-mixtral");
  const auto shapes = model_shapes(c);
  const std::string table = format_tp_plan(plan_or_die(c, AutoTpOptions{}, 4), c, shapes);
  EXPECT_NE(table.find("model_type mixtral, tensor_parallel 4"), std::string::npos) << table;
  EXPECT_NE(table.find("tensor"), std::string::npos);
  EXPECT_NE(table.find("per-rank shape"), std::string::npos);
  auto line_of = [&](const std::string& name) {
    size_t pos = table.find(name + " ");
    EXPECT_NE(pos, std::string::npos) << name << "\n" << table;
    if (pos == std::string::npos) return std::string();
    return table.substr(pos, table.find('\n', pos) - pos);
  };
  const std::string w2 = line_of(kMixW2);
  EXPECT_NE(w2.find("row"), std::string::npos) << w2;
  EXPECT_NE(w2.find("[64, 32]"), std::string::npos) << w2;
  EXPECT_LT(w2.find("[64, 128]"), w2.find("[64, 32]")) << w2;
  const std::string router = line_of(kMixRouter);
  EXPECT_NE(router.find("keep"), std::string::npos) << router;
  EXPECT_NE(router.find("[4, 64]"), router.rfind("[4, 64]")) << router;
  const std::string k = line_of("model.layers.0.self_attn.k_proj.weight");
  EXPECT_LT(k.find("[32, 64]"), k.find("[16, 64]")) << k;
  EXPECT_NE(k.find("[16, 64]"), std::string::npos) << k;
  EXPECT_NE(k.find("kv head = rank / 2 (replicated)"), std::string::npos) << k;
}

}  // namespace
}  // namespace tessera
