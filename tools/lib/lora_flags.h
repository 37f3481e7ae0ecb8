#pragma once
// The LoRA flags tessera-generate and tessera-bench share: --lora NAME=PATH (repeatable) into
// lora.adapters; an error names the flag and the entry that is wrong.
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

// name -> PEFT folder; names as valid_lora_name (common/config.h) allows, each given once.
StatusOr<std::map<std::string, std::string>> lora_adapters_from_flags(const std::vector<std::string>& flags);

}  // namespace tessera
