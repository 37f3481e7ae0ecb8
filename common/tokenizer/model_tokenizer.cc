#include "common/tokenizer/model_tokenizer.h"

#include <filesystem>

#include "common/gguf/gguf_file.h"
#include "common/input_file.h"
#include "common/logging.h"
#include "common/tokenizer/gguf_vocab.h"

namespace tessera {

StatusOr<std::unique_ptr<Tokenizer>> load_model_tokenizer(const std::string& model_path, const std::string& config_dir) {
  if (!is_gguf_path(model_path)) return Tokenizer::load(config_dir);
  const std::filesystem::path beside = std::filesystem::path(config_dir) / "tokenizer.json";
  TESSERA_ASSIGN_OR_RETURN(const bool has_beside, input_path_exists(beside.string()));
  if (has_beside) {
    TESSERA_LOG_INFO("tokenizer: {} (beside the GGUF file: it overrides the file's own vocabulary)", beside.string());
    return Tokenizer::load(config_dir);
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(model_path));
  TESSERA_LOG_INFO("tokenizer: the vocabulary in {} (tokenizer.ggml.*)", model_path);
  return tokenizer_from_gguf(*file);
}

}  // namespace tessera
