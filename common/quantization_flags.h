#pragma once
// The --quantize / --quantize-group / --quantize-rule flags of the one-process programs
// (tessera-generate, tessera-perplexity, tessera-bench), checked with errors that name the flag. A rule is
// REGEX=int8 or REGEX=none (model.quantization_rules; split at the last '=').
#include <string>
#include <vector>

#include "common/quantization.h"
#include "common/status.h"

namespace tessera {

// The --quantize help text, the same in every program (tessera-serve and tessera-batch too).
inline constexpr const char* kQuantizeFlagHelp =
    "weight quantization: auto (a GGUF file's quantized matrices in their own bits: q4_0/q4_1/q4_K 4-bit, "
    "q5_0/q5_1/q5_K 5-bit, q6_K 6-bit, q8_0 int8; else none), none, int8 or int4";
// The --quantize-group help text, the same in every program.
inline constexpr const char* kQuantizeGroupHelp =
    "int8: input elements per scale, auto (default: 128, 64 or 32, the largest dividing each layer's input) or a "
    "multiple of 32 in [32, 256]";

// The --bf16-coding help text (model.bf16_coding), the same in every program.
inline constexpr const char* kBf16CodingFlagHelp =
    "coded bf16 linear weights, 12 bits each, lossless (model.bf16_coding; docs/quantization.md): auto (on for "
    "bfloat16 weights where the CPU has AVX-512 BF16), on or off";

// bf16_coding: --bf16-coding's value (auto, on or off).
StatusOr<QuantizationOptions> quantization_from_flags(const std::string& quantize, const std::string& group,
                                                      const std::vector<std::string>& rules = {},
                                                      const std::string& bf16_coding = "auto");

}  // namespace tessera
