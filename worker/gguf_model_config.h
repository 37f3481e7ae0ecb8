#pragma once
// The config.json a GGUF file's metadata implies: llama.cpp's `<arch>.*` keys (widths, heads,
// context length, rope base and dimensions, norm epsilon, experts, rope scaling) written under
// the row's config.json key names, over the row's defaults, so that parse_model_config reads
// a GGUF model as it reads a Hugging Face folder and refuses the same unsupported settings.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tessera {

class GgufFile;
struct ArchSpec;

// `vocab`: the embedding's rows; `tied`: the file has no output.weight. Tensors read as
// metadata (Llama 3's rope_freqs.weight) are appended to `consumed`. Missing required keys
// are NotFound, odd values InvalidArgument or Unimplemented, each naming the file and key.
StatusOr<nlohmann::json> gguf_model_config(const GgufFile& file, const ArchSpec& row, const std::string& arch,
                                           int64_t vocab, bool tied, std::vector<std::string>* consumed);

}  // namespace tessera
