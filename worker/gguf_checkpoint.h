#pragma once
// A GGUF file (llama.cpp's model format; split files open from their first part) as a
// Checkpoint: the ArchSpec row that serves its general.architecture names each tensor in
// Hugging Face terms, its metadata becomes config.json (worker/gguf_model_config.h), and each
// tensor is presented with its Hugging Face name and shape, in the Hugging Face row order
// (the rows llama.cpp's converter permuted are read through TensorInfo::row_order), decoded
// from its ggml blocks when loaded. Every GGUF tensor must find its place: one that no role
// claims, or of a type Tessera does not decode, is refused by name.
#include <memory>
#include <string>

#include "common/checkpoint.h"
#include "common/gguf/gguf_file.h"  // is_gguf_path
#include "common/status.h"

namespace tessera {

StatusOr<std::unique_ptr<Checkpoint>> open_gguf_checkpoint(const std::string& path);

}  // namespace tessera
