#pragma once
// Opens a model's checkpoint (a Hugging Face folder, a safetensors file or a DeepSpeed
// checkpoint JSON) and checks what only the architecture table can judge: that a
// DeepSpeed JSON's "type" names a family Tessera serves.
#include <memory>
#include <string>

#include "common/checkpoint.h"
#include "common/status.h"

namespace tessera {

StatusOr<std::unique_ptr<Checkpoint>> open_model_checkpoint(const std::string& path);

}  // namespace tessera
