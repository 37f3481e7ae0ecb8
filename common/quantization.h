#pragma once
// Weight quantization as the configuration names it (`model.quantization`,
// `model.quantization_group`, `model.quantization_rules`; docs/quantization.md). The loader
// (worker/weight_quantization.h) applies it; the kernels (kernels/cpu/linear_int8.h and the
// CUDA one) compute with it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {
namespace tok {
class Regex;
}

enum class WeightQuantization : uint8_t {
  kNone,  // weights in the compute dtype (model.dtype)
  kInt8,  // symmetric int8, one f32 scale per group of consecutive input elements of each output row
  // The default: for a GGUF file whose matrices are stored quantized, each such matrix kept
  // in its own bits value for value (q4_0 / q4_1 / q4_K as 4-bit panels, q5_0 / q5_1 / q5_K
  // as 5-bit, q6_K as 6-bit, q8_0 as int8 with its scale per 32), not widened to
  // model.dtype's two or four bytes; none for every other checkpoint. The loader decides once
  // the checkpoint is open (resolve_quantization, worker/weight_quantization.h) and logs what
  // it chose.
  kAuto,
  // 4-bit weights (kernels/int4_layout.h): q4_0 / q4_1 / q4_K matrices of a GGUF file as they
  // are, every other selected matrix quantized by q4_0's rule (groups of 32, an f16 scale each).
  kInt4,
};
const char* weight_quantization_name(WeightQuantization q);  // "none", "int8", "auto", "int4"
// "none" / "int8" / "auto" / "int4"; nullopt for anything else.
std::optional<WeightQuantization> parse_weight_quantization(std::string_view name);

// Coded bf16 weights (`model.bf16_coding`; kernels/coded_bf16_layout.h): bfloat16 linear
// weights kept in 12 bits per weight, losslessly, which decode reads 3/4 as many bytes of.
enum class Bf16Coding : uint8_t {
  // The default: on where the CPU backend has its fast kernel (AVX-512 BF16 with bf16 dot
  // products on) for model.dtype bfloat16 with every weight resident; off elsewhere.
  kAuto,
  kOn,
  kOff,
};
const char* bf16_coding_name(Bf16Coding c);  // "auto", "on", "off"
std::optional<Bf16Coding> parse_bf16_coding(std::string_view name);

// Group sizes a user may choose: a multiple of 32 in [32, 256] (the SIMD kernels read a group
// as whole 16- and 32-lane vectors).
inline constexpr int kMinQuantGroup = 32;
inline constexpr int kMaxQuantGroup = 256;
// The default, "auto" (0 here): per linear weight, 128 where it divides the input dimension of
// this rank's matrix, else 64, else 32 (else the refusal that names the tensor). 128 decodes
// 1.2-1.3x faster than 64 at batch 1 (a group's integer sums are converted and scaled once
// per group: half as often) for 1/32 byte of scale per weight; 64 and 32 keep models whose
// widths 128 does not divide (kjv-llama's hidden size is 192) quantizable without a flag.
// docs/quantization.md has the measurements.
inline constexpr int kAutoQuantGroup = 0;
inline constexpr int kDefaultQuantGroup = kAutoQuantGroup;
bool valid_quant_group(int group);  // an explicit size: a multiple of 32 in [32, 256]
// The group "auto" picks for an input dimension K; 0 when none of 128, 64, 32 divides it.
int auto_quant_group(int64_t K);
// "auto" or a valid size; nullopt for anything else.
std::optional<int> parse_quant_group(std::string_view text);
std::string quant_group_name(int group);  // "auto" or the number

// One ordered override of which linear weights are quantized: the first rule whose regex is
// found in a linear weight's checkpoint name decides (int8, int4 or kept in the compute dtype).
struct QuantRuleConfig {
  std::string match;  // PCRE2 regex, searched (unanchored) in the tensor name
  WeightQuantization quantize = WeightQuantization::kInt8;
  std::shared_ptr<const tok::Regex> regex;  // compiled when the config is read
  bool operator==(const QuantRuleConfig& o) const { return match == o.match && quantize == o.quantize; }
};

// What the weight loader needs; made from the configuration's model section or from a
// command line's --quantize.
struct QuantizationOptions {
  WeightQuantization kind = WeightQuantization::kAuto;
  int group = kDefaultQuantGroup;
  std::vector<QuantRuleConfig> rules;
  // Set by resolve_quantization for auto on a GGUF file of quantized blocks (kind is then
  // kInt8): matrices stored in blocks a kernel computes from are kept as they are, value for
  // value (q4_* / q5_* / q6_K as panels of their bits, q8_0 as int8 with its own scales).
  bool keep_blocks = false;
  // Also set there: every linear weight is computed as the file stores it, the LM head
  // included: quantized where it is stored in quantized blocks (int8, or panels from 4- to
  // 6-bit blocks), in the compute dtype where it is stored in floats (a rule may say
  // otherwise). Elsewhere an untied LM head is int8 under int4 and stays in floats under int8.
  bool as_stored = false;
  // Whether the linear weights left in bfloat16 are coded (Bf16Coding); the loader makes
  // kAuto definite before it loads (worker/transformer.cc) and codes only under kOn.
  Bf16Coding bf16_coding = Bf16Coding::kAuto;
  // Some weights quantized for certain (kAuto is decided only once resolved against a checkpoint).
  bool enabled() const { return kind == WeightQuantization::kInt8 || kind == WeightQuantization::kInt4; }
};

}  // namespace tessera
