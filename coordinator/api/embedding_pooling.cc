#include "coordinator/api/embedding_pooling.h"

#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/input_file.h"

namespace tessera {

namespace {

using nlohmann::json;

constexpr const char* kPoolingModule = "sentence_transformers.models.Pooling";
constexpr const char* kNormalizeModule = "sentence_transformers.models.Normalize";
constexpr const char* kTransformerModule = "sentence_transformers.models.Transformer";

// What the sentence-transformers files say; nullopt fields where they say nothing.
struct SentenceTransformerFiles {
  std::optional<Pooling> pooling;
  bool normalize = false;
  bool present = false;  // modules.json exists
};

// The Pooling module's config.json: exactly one mode Tessera computes.
StatusOr<Pooling> read_pooling_config(const std::filesystem::path& path) {
  const std::string what = "the sentence-transformers pooling config";
  TESSERA_ASSIGN_OR_RETURN(const json j, read_input_json(path.string(), what));
  if (!j.is_object()) return invalid_argument(path.string() + ": must be a JSON object");
  auto flag = [&](const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
  for (const char* unsupported :
       {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens"}) {
    if (flag(unsupported))
      return invalid_argument(path.string() + ": " + unsupported +
                              " is not a pooling Tessera computes (last token, mean or CLS; set model.pooling to serve "
                              "one of those instead)");
  }
  if (j.contains("include_prompt") && j["include_prompt"].is_boolean() && !j["include_prompt"].get<bool>())
    return invalid_argument(path.string() + ": include_prompt false (pooling without the instruction's tokens) is not "
                            "implemented");
  std::vector<Pooling> modes;
  if (flag("pooling_mode_lasttoken")) modes.push_back(Pooling::kLast);
  if (flag("pooling_mode_mean_tokens")) modes.push_back(Pooling::kMean);
  if (flag("pooling_mode_cls_token")) modes.push_back(Pooling::kCls);
  if (modes.size() != 1)
    return invalid_argument(path.string() + ": " + (modes.empty() ? "no" : "more than one") +
                            " pooling mode set (one of pooling_mode_lasttoken, pooling_mode_mean_tokens, "
                            "pooling_mode_cls_token)");
  return modes[0];
}

StatusOr<SentenceTransformerFiles> read_sentence_transformer_files(const std::filesystem::path& dir) {
  SentenceTransformerFiles out;
  const std::filesystem::path modules_path = dir / "modules.json";
  TESSERA_ASSIGN_OR_RETURN(const bool exists, input_path_exists(modules_path.string()));
  if (!exists) return out;
  out.present = true;
  TESSERA_ASSIGN_OR_RETURN(const json modules, read_input_json(modules_path.string(), "modules.json"));
  if (!modules.is_array()) return invalid_argument(modules_path.string() + ": must be a JSON array of modules");
  for (size_t i = 0; i < modules.size(); ++i) {
    const json& m = modules[i];
    const std::string where = modules_path.string() + ": module " + std::to_string(i);
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string())
      return invalid_argument(where + " has no 'type'");
    const std::string type = m["type"].get<std::string>();
    const std::string sub = m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
    if (type == kTransformerModule) continue;
    if (type == kNormalizeModule) {
      out.normalize = true;
      continue;
    }
    if (type == kPoolingModule) {
      if (sub.empty() || sub.find("..") != std::string::npos || sub.front() == '/')
        return invalid_argument(where + " (Pooling) has no usable 'path'");
      TESSERA_ASSIGN_OR_RETURN(out.pooling, read_pooling_config(dir / sub / "config.json"));
      continue;
    }
    return invalid_argument(where + " is a " + type +
                            ", which Tessera does not compute (only Transformer, Pooling and Normalize)");
  }
  return out;
}

}  // namespace

const char* pooling_name(Pooling pooling) {
  switch (pooling) {
    case Pooling::kLast: return "last";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
    case Pooling::kNone: break;
  }
  return "none";
}

StatusOr<EmbeddingPooling> embedding_pooling(const std::string& model_dir, const std::string& pooling,
                                             const std::string& normalize) {
  EmbeddingPooling out;
  SentenceTransformerFiles files;
  if (pooling == "auto" || normalize == "auto") {
    TESSERA_ASSIGN_OR_RETURN(files, read_sentence_transformer_files(model_dir));
  }
  if (pooling == "last" || pooling == "mean" || pooling == "cls") {
    out.pooling = pooling == "last" ? Pooling::kLast : pooling == "mean" ? Pooling::kMean : Pooling::kCls;
    out.pooling_source = "model.pooling";
  } else if (pooling != "auto") {
    return invalid_argument("model.pooling: '" + pooling + "' is not one of auto, last, mean, cls");
  } else if (files.pooling) {
    out.pooling = *files.pooling;
    out.pooling_source = "the sentence-transformers Pooling config";
  } else {
    out.pooling = Pooling::kLast;
    out.pooling_source = files.present ? "modules.json has no Pooling module: last token"
                                       : "no sentence-transformers files: last token, as for decoder models";
  }
  if (normalize == "true" || normalize == "false") {
    out.normalize = normalize == "true";
    out.normalize_source = "model.normalize";
  } else if (normalize != "auto") {
    return invalid_argument("model.normalize: '" + normalize + "' is not one of auto, true, false");
  } else if (files.present) {
    out.normalize = files.normalize;
    out.normalize_source = files.normalize ? "modules.json has a Normalize module" : "modules.json has no Normalize module";
  } else {
    out.normalize = true;
    out.normalize_source = "no sentence-transformers files: normalised";
  }
  return out;
}

}  // namespace tessera
