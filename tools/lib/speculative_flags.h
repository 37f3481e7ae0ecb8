#pragma once
// The speculative-decoding flags tessera-generate and tessera-bench share (--speculative,
// --speculative-tokens, --draft-model, --draft-min-probability) into speculative.* settings;
// an error names the flag that is wrong.
#include <string>

#include "common/speculative_config.h"
#include "common/status.h"

namespace tessera {

struct SpeculativeFlags {
  std::string method = "none";
  int num_tokens = 4;
  std::string draft_model;
  double draft_min_probability = SpeculativeConfig{}.draft_min_probability;
};

StatusOr<SpeculativeConfig> speculative_from_flags(const SpeculativeFlags& flags);

}  // namespace tessera
