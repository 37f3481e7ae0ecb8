#pragma once
// The family-specific half of reading a GGUF file's metadata into config.json
// (ArchSpec::gguf_config): what llama.cpp's converter stores in its own way (Llama 3 rope
// scaling as a tensor of frequency factors, Falcon's layout as the tensors present) or does
// not store at all and its loader assumes (Gemma's query scale, soft-cap defaults), written
// as the Hugging Face keys the row's config parser reads.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tessera {

class GgufFile;

// Each: `config` holds the generic keys already (worker/gguf_model_config.h); tensors the
// function read as metadata are appended to `consumed`.
Status gguf_config_llama(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                         std::vector<std::string>* consumed);
Status gguf_config_phi3(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                        std::vector<std::string>* consumed);
Status gguf_config_gemma2(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                          std::vector<std::string>* consumed);
Status gguf_config_gemma3(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                          std::vector<std::string>* consumed);
Status gguf_config_falcon(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                          std::vector<std::string>* consumed);
Status gguf_config_granite(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                           std::vector<std::string>* consumed);
Status gguf_config_minicpm(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                           std::vector<std::string>* consumed);
Status gguf_config_gpt_neox(const GgufFile& file, const std::string& arch, nlohmann::json* config,
                            std::vector<std::string>* consumed);

}  // namespace tessera
