#pragma once
// The --quantize / --quantize-group flags of the one-process programs (tessera-generate,
// tessera-bench, tessera-perplexity), checked with errors that name the flag.
#include <string>

#include "common/quantization.h"
#include "common/status.h"

namespace tessera {

StatusOr<QuantizationOptions> quantization_from_flags(const std::string& quantize, int group);

}  // namespace tessera
