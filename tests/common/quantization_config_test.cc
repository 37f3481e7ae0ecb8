// The quantization keys of the configuration (model.quantization, model.quantization_group,
// model.quantization_rules): parsed, dumped and read back, --set, and every bad value an
// error naming the key (docs/configuration.md).
#include <gtest/gtest.h>

#include "common/config.h"

namespace tessera {
namespace {

TEST(QuantizationConfigTest, DefaultsAndAFullSectionRoundTrip) {
  auto d = parse_config_yaml("", "empty.yaml");
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->model.quantization, WeightQuantization::kAuto);  // int8 only for quantized GGUF files
  EXPECT_EQ(d->model.quantization_group, kAutoQuantGroup);
  EXPECT_TRUE(d->model.quantization_rules.empty());
  // "auto" is written out as such and read back.
  auto d2 = parse_config_yaml(dump_config_yaml(*d), "dumped.yaml");
  ASSERT_TRUE(d2.is_ok()) << d2.status().to_string();
  EXPECT_EQ(d2->model.quantization_group, kAutoQuantGroup);
  EXPECT_NE(dump_config_yaml(*d).find("quantization_group: auto"), std::string::npos) << dump_config_yaml(*d);

  const std::string yaml =
      "model:\n  path: m\n  quantization: int8\n  quantization_group: 128\n"
      "  quantization_rules:\n    - {match: 'lm_head', quantize: int8}\n    - {match: 'layers\\.0\\.', quantize: none}\n";
  auto c = parse_config_yaml(yaml, "q.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->model.quantization, WeightQuantization::kInt8);
  EXPECT_EQ(c->model.quantization_group, 128);
  ASSERT_EQ(c->model.quantization_rules.size(), 2u);
  EXPECT_EQ(c->model.quantization_rules[1].match, "layers\\.0\\.");
  EXPECT_EQ(c->model.quantization_rules[1].quantize, WeightQuantization::kNone);
  ASSERT_NE(c->model.quantization_rules[0].regex, nullptr);
  EXPECT_TRUE(validate_config(*c).is_ok());
  auto again = parse_config_yaml(dump_config_yaml(*c), "dumped.yaml");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->model.quantization, c->model.quantization);
  EXPECT_EQ(again->model.quantization_group, c->model.quantization_group);
  EXPECT_EQ(again->model.quantization_rules, c->model.quantization_rules);
  const QuantizationOptions q = quantization_options(c->model);
  EXPECT_TRUE(q.enabled());
  EXPECT_EQ(q.group, 128);
  EXPECT_EQ(q.rules.size(), 2u);
}

TEST(QuantizationConfigTest, SetOverrides) {
  TesseraConfig c;
  ASSERT_TRUE(apply_override(c, "model.quantization", "int8").is_ok());
  ASSERT_TRUE(apply_override(c, "model.quantization_group", "32").is_ok());
  ASSERT_TRUE(apply_override(c, "model.quantization_rules", "[{match: lm_head, quantize: int8}]").is_ok());
  EXPECT_EQ(c.model.quantization, WeightQuantization::kInt8);
  EXPECT_EQ(c.model.quantization_group, 32);
  EXPECT_EQ(c.model.quantization_rules.size(), 1u);
  ASSERT_TRUE(apply_override(c, "model.quantization_group", "auto").is_ok());
  EXPECT_EQ(c.model.quantization_group, kAutoQuantGroup);
}

// "auto" takes the largest of 128, 64, 32 that divides the input dimension.
TEST(QuantizationConfigTest, AutoGroupIsTheLargestOf128_64_32ThatDivides) {
  EXPECT_EQ(auto_quant_group(4096), 128);
  EXPECT_EQ(auto_quant_group(5632), 128);
  EXPECT_EQ(auto_quant_group(192), 64);   // kjv-llama's hidden size
  EXPECT_EQ(auto_quant_group(96), 32);
  EXPECT_EQ(auto_quant_group(344), 0);    // tiny-llama's MLP: none divides
  EXPECT_EQ(auto_quant_group(0), 0);
}

TEST(QuantizationConfigTest, BadValuesNameTheKey) {
  struct Case {
    std::string yaml, needle;
  };
  for (const Case& k : std::vector<Case>{
           {"model: {quantization: int2}", "model.quantization: expected auto | none | int8 | int4, got 'int2'"},
           {"model: {quantization_group: 48}", "model.quantization_group: expected \"auto\" or a multiple of 32 in [32, 256], got '48'"},
           {"model: {quantization_group: 512}", "model.quantization_group: expected \"auto\" or a multiple of 32 in [32, 256], got '512'"},
           {"model: {quantization_group: automatic}", "model.quantization_group: expected \"auto\" or a multiple of 32 in [32, 256], got 'automatic'"},
           {"model: {quantization_group: [64]}", "model.quantization_group: expected \"auto\" or a multiple of 32"},
           {"model: {quantization_rules: lm_head}", "model.quantization_rules: expected a list of {match: REGEX, quantize: int8|int4|none}"},
           {"model: {quantization_rules: [{match: lm_head}]}", "model.quantization_rules[0]: missing key 'quantize'"},
           {"model: {quantization_rules: [{match: lm_head, quantize: int2}]}", "model.quantization_rules[0].quantize"},
           {"model: {quantization_rules: [{match: '(', quantize: int8}]}", "model.quantization_rules[0].match: invalid regular expression"},
           {"model: {quantization_rules: [{match: a, quantize: int8, role: row}]}", "model.quantization_rules[0].role: unknown key"},
       }) {
    auto c = parse_config_yaml(k.yaml, "cfg.yaml");
    ASSERT_FALSE(c.is_ok()) << k.yaml;
    EXPECT_NE(c.status().message().find(k.needle), std::string::npos) << c.status().message();
  }
  auto c = parse_config_yaml("model: {path: m, quantization_rules: [{match: a, quantize: int8}]}", "cfg.yaml");
  ASSERT_TRUE(c.is_ok());
  const Status st = validate_config(*c);
  EXPECT_NE(st.message().find("model.quantization_rules: given while model.quantization is auto"), std::string::npos)
      << st.message();
  // A rule cannot say auto: it decides int8 or not for its tensors.
  auto r = parse_config_yaml("model: {quantization: int8, quantization_rules: [{match: a, quantize: auto}]}", "cfg.yaml");
  EXPECT_FALSE(r.is_ok());
}

}  // namespace
}  // namespace tessera
