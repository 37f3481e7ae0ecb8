#pragma once
// The --quantize / --quantize-group / --quantize-rule flags of the one-process programs
// (tessera-generate, tessera-perplexity, tessera-bench), checked with errors that name the flag. A rule is
// REGEX=int8 or REGEX=none (model.quantization_rules; split at the last '=').
#include <string>
#include <vector>

#include "common/quantization.h"
#include "common/status.h"

namespace tessera {

// The --quantize-group help text, the same in every program.
inline constexpr const char* kQuantizeGroupHelp =
    "int8: input elements per scale, auto (default: 128, 64 or 32, the largest dividing each layer's input) or a "
    "multiple of 32 in [32, 256]";

StatusOr<QuantizationOptions> quantization_from_flags(const std::string& quantize, const std::string& group,
                                                      const std::vector<std::string>& rules = {});

}  // namespace tessera
