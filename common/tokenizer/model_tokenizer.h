#pragma once
// The tokenizer a model brings: a Hugging Face folder's tokenizer.json (+ tokenizer_config.json),
// or a GGUF file's own vocabulary (tokenizer.ggml.*), which a tokenizer.json in the file's
// folder overrides. Which one is used is logged at start-up.
#include <memory>
#include <string>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

// `model_path`: what --model / model.path names; `config_dir`: the folder holding its
// config.json (the GGUF file's folder for a .gguf).
StatusOr<std::unique_ptr<Tokenizer>> load_model_tokenizer(const std::string& model_path, const std::string& config_dir);

}  // namespace tessera
