// What Tessera does not compute it refuses, by name: for each family, a fixture model with
// one config.json field changed to a variant Tessera does not implement must make the real
// tessera-generate exit non-zero with one line naming the field — never run something else.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Variant {
  std::string name;     // test name
  std::string model;    // fixture folder
  nlohmann::json edit;  // merged into config.json (null values are written as null)
  std::string needle;   // the stderr line must contain it
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.model << " with " << v.edit.dump(); }

std::vector<Variant> variants() {
  using J = nlohmann::json;
  return {
      {"llama_rope_yarn_no_factor", "tiny-llama3", J{{"rope_scaling", {{"rope_type", "yarn"}}}}, "missing key \"factor\""},
      {"llama_rope_dynamic", "tiny-llama", J{{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}},
       "rope_scaling of type \"dynamic\""},
      {"llama3_missing_field", "tiny-llama3",
       J{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}}}},
       "high_freq_factor"},
      {"llama_activation", "tiny-llama", J{{"hidden_act", "relu2"}}, "activation \"relu2\""},
      {"mistral_layer_types", "tiny-mistral-swa",
       J{{"layer_types", {"sliding_attention", "chunked_attention", "full_attention"}}}, "layer_types[1]"},
      {"mistral_layer_types_count", "tiny-mistral-swa", J{{"layer_types", {"sliding_attention"}}}, "layer_types"},
      {"qwen2_rope_yarn_beta", "tiny-qwen2", J{{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"beta_fast", -1}}}},
       "beta_fast"},
      {"qwen3_activation", "tiny-qwen3", J{{"hidden_act", "gelu_quick"}}, "activation \"gelu_quick\""},
      {"qwen3_moe_dense_layer_index", "tiny-qwen3-moe", J{{"mlp_only_layers", {7}}}, "mlp_only_layers"},
      {"qwen3_moe_top_k", "tiny-qwen3-moe", J{{"num_experts_per_tok", 9}}, "num_experts_per_tok"},
      {"qwen2_moe_no_shared_width", "tiny-qwen2-moe", J{{"shared_expert_intermediate_size", nullptr}},
       "shared_expert_intermediate_size"},
      {"phi3_longrope_factor_count", "tiny-phi3",
       J{{"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}}}},
       "one per rotated pair needs 8"},
      {"phi3_longrope_no_long_factor", "tiny-phi3",
       J{{"rope_scaling", {{"type", "longrope"}, {"short_factor", {1, 1, 1, 1, 1, 1, 1, 1}}}}}, "\"long_factor\""},
      {"phi3_longrope_zero_factor", "tiny-phi3",
       J{{"rope_scaling",
          {{"type", "su"}, {"short_factor", {1, 1, 1, 0, 1, 1, 1, 1}}, {"long_factor", {1, 1, 1, 1, 1, 1, 1, 1}}}}},
       "short_factor[3] must be a positive number"},
      {"phi3_partial_rotary_odd", "tiny-phi3", J{{"partial_rotary_factor", 0.2}}, "even number of rotated dims"},
      {"gemma2_activation", "tiny-gemma2", J{{"hidden_activation", "gelu_quick"}}, "hidden_activation"},
      {"gemma3_rope_longrope", "tiny-gemma3", J{{"rope_scaling", {{"rope_type", "longrope"}, {"factor", 8.0}}}},
       "short_factor"},
      {"gemma3_query_scalar", "tiny-gemma3", J{{"query_pre_attn_scalar", -1}}, "query_pre_attn_scalar"},
      {"falcon_alibi", "tiny-falcon", J{{"alibi", true}}, "alibi"},
      {"falcon_new_arch_one_norm_sequential", "tiny-falcon",
       J{{"new_decoder_architecture", true}, {"num_ln_in_parallel_attn", 1}, {"parallel_attn", false}},
       "num_ln_in_parallel_attn"},
      {"falcon_activation", "tiny-falcon", J{{"activation", "relu"}}, "activation \"relu\""},
      {"gpt_neox_rotary_pct", "tiny-gpt-neox", J{{"rotary_pct", 0.1}}, "even number of rotated dims"},
      {"gpt_neox_rope_dynamic", "tiny-gpt-neox", J{{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}},
       "rope_scaling of type \"dynamic\""},
      {"gpt2_cross_attention", "tiny-gpt2", J{{"add_cross_attention", true}}, "add_cross_attention"},
      {"gpt2_activation", "tiny-gpt2", J{{"activation_function", "relu"}}, "activation_function"},
      {"gpt2_no_positions", "tiny-gpt2", J{{"n_positions", nullptr}}, "learned position embeddings"},
      {"starcoder2_activation", "tiny-starcoder2", J{{"hidden_act", "gelu_10"}}, "activation \"gelu_10\""},
      {"bloom_post_ln_residual", "tiny-bloom", J{{"apply_residual_connection_post_layernorm", true}},
       "apply_residual_connection_post_layernorm"},
      {"bloom_sliding_window", "tiny-bloom", J{{"sliding_window", 16}}, "\"sliding_window\" is not supported"},
      {"granite_logits_scaling", "tiny-llama", J{{"model_type", "granite"}, {"logits_scaling", 0}}, "logits_scaling"},
      {"granite_sliding_window", "tiny-llama", J{{"model_type", "granite"}, {"sliding_window", 64}},
       "\"sliding_window\" is not supported"},
      {"smollm3_no_rope_count", "tiny-llama", J{{"model_type", "smollm3"}, {"no_rope_layers", {1, 0}}}, "no_rope_layers"},
      {"smollm3_no_rope_value", "tiny-llama", J{{"model_type", "smollm3"}, {"no_rope_layers", {1, 2, 1}}},
       "no_rope_layers[1] must be 0 or 1"},
      {"minicpm_no_scale_depth", "tiny-llama", J{{"model_type", "minicpm"}, {"scale_emb", 12}, {"dim_model_base", 32}},
       "missing key \"scale_depth\""},
      {"minicpm_experts", "tiny-llama",
       J{{"model_type", "minicpm"}, {"scale_emb", 12}, {"scale_depth", 1.4}, {"dim_model_base", 32}, {"num_experts", 8}},
       "\"num_experts\" 8"},
      {"unknown_model_type", "tiny-llama", J{{"model_type", "mamba"}}, "unknown model_type \"mamba\""},
  };
}

class RefusedVariantTest : public ::testing::TestWithParam<Variant> {};

TEST_P(RefusedVariantTest, OneLineNamingTheFieldAndNonZeroExit) {
  TESSERA_REQUIRE_FIXTURES();
  const Variant& v = GetParam();
  const std::string dir = testing::make_temp_dir("tessera-refused");
  const std::string model = dir + "/" + v.model;
  fs::copy(testing::fixtures_dir() + "/" + v.model, model, fs::copy_options::recursive);
  fs::permissions(model, fs::perms::owner_all, fs::perm_options::add);
  fs::permissions(model + "/config.json", fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  nlohmann::json config = nlohmann::json::parse(testing::read_file(model + "/config.json"));
  for (const auto& [key, value] : v.edit.items()) config[key] = value;
  testing::write_file(model + "/config.json", config.dump(2));
  const auto r = testing::run_command(testing::bin_dir() + "/tessera-generate --model '" + model +
                                      "' --prompt-ids 1,5,7 --max-new-tokens 2");
  fs::remove_all(dir);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(v.needle), std::string::npos) << "stderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
}

INSTANTIATE_TEST_SUITE_P(Families, RefusedVariantTest, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
