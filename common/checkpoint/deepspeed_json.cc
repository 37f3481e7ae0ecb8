#include "common/checkpoint/deepspeed_json.h"

#include "common/input_file.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tessera {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

Status file_list(const json& node, const std::string& where, const std::string& field, std::vector<std::string>* out) {
  if (node.is_string()) {
    out->push_back(node.get<std::string>());
    return Status::ok();
  }
  if (!node.is_array()) return invalid_argument(where + ": \"" + field + "\" must be a list of file names, got " + node.dump());
  for (const auto& item : node) {
    if (!item.is_string()) return invalid_argument(where + ": \"" + field + "\" entries must be file names, got " + item.dump());
    out->push_back(item.get<std::string>());
  }
  return Status::ok();
}

// tp_size, or its older name mp_size; 0 when neither is given.
StatusOr<int64_t> tp_size_of(const json& ds, const std::string& where) {
  int64_t size = 0;
  for (const char* key : {"tp_size", "mp_size"}) {
    if (!ds.contains(key)) continue;
    const json& v = ds[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) return invalid_argument(where + ": \"" + key + "\" must be a positive integer, got " + v.dump());
    if (size != 0 && size != v.get<int64_t>()) return invalid_argument(where + ": \"tp_size\" and \"mp_size\" disagree");
    size = v.get<int64_t>();
  }
  return size;
}

}  // namespace

StatusOr<DeepSpeedCheckpoint> read_deepspeed_json(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, read_input_file(path, "the DeepSpeed checkpoint JSON"));
  json ds;
  try {
    ds = json::parse(text);
  } catch (const json::parse_error& e) {
    return invalid_argument(path + ": DeepSpeed checkpoint JSON is not valid JSON: " + e.what());
  }
  if (!ds.is_object()) return invalid_argument(path + ": DeepSpeed checkpoint JSON is not an object");
  if (!ds.contains("checkpoints")) return invalid_argument(path + ": DeepSpeed checkpoint JSON lacks \"checkpoints\"");
  if (!ds.contains("type") || !ds["type"].is_string())
    return invalid_argument(path + ": DeepSpeed checkpoint JSON lacks a string \"type\"");
  DeepSpeedCheckpoint out;
  out.type = ds["type"].get<std::string>();

  std::string parallelization = "pp";
  if (ds.contains("parallelization")) {
    if (!ds["parallelization"].is_string()) return invalid_argument(path + ": \"parallelization\" must be \"pp\" or \"tp\"");
    parallelization = ds["parallelization"].get<std::string>();
    if (parallelization != "pp" && parallelization != "tp")
      return invalid_argument(path + ": \"parallelization\" is \"" + parallelization + "\"; DeepSpeed knows \"pp\" and \"tp\"");
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t tp_size, tp_size_of(ds, path));
  if (ds.contains("dtype")) {
    if (!ds["dtype"].is_string()) return invalid_argument(path + ": \"dtype\" must be a string");
    const std::string dtype = ds["dtype"].get<std::string>();
    if (dtype == "int8")
      return unimplemented(path + ": \"dtype\": \"int8\" (a DeepSpeed-quantized checkpoint) is not supported; use the float checkpoint");
    // Otherwise informational: each file says its own dtype, and model.dtype picks the compute type.
  }

  const json& ckpts = ds["checkpoints"];
  std::vector<std::string> names, tp_names;
  if (ckpts.is_object()) {
    for (const auto& [key, value] : ckpts.items()) {
      if (key != "non_tp" && key != "tp")
        return invalid_argument(path + ": \"checkpoints\" has the key \"" + key + "\"; DeepSpeed writes \"non_tp\" and \"tp\"");
    }
    std::vector<std::string> non_tp, tp;
    if (ckpts.contains("non_tp")) TESSERA_RETURN_IF_ERROR(file_list(ckpts["non_tp"], path, "checkpoints.non_tp", &non_tp));
    if (ckpts.contains("tp")) TESSERA_RETURN_IF_ERROR(file_list(ckpts["tp"], path, "checkpoints.tp", &tp));
    if (!tp.empty()) {
      // DeepSpeed writes tp_{rank}_{partition}.pt for every rank of every partition.
      const int64_t ranks = tp_size != 0 ? tp_size : 1;
      if (static_cast<int64_t>(tp.size()) % ranks != 0) {
        return invalid_argument(path + ": \"checkpoints\".\"tp\" lists " + std::to_string(tp.size()) +
                                " files, which is not a multiple of tp_size " + std::to_string(ranks) +
                                " (DeepSpeed writes one file per rank per partition)");
      }
    }
    names = std::move(non_tp);
    tp_names = std::move(tp);
  } else {
    TESSERA_RETURN_IF_ERROR(file_list(ckpts, path, "checkpoints", &names));
  }
  if (parallelization == "tp" && !ckpts.is_object())
    return invalid_argument(path + ": \"parallelization\": \"tp\" needs \"checkpoints\": {\"non_tp\": [...], \"tp\": [...]}");
  if (names.empty() && tp_names.empty()) return invalid_argument(path + ": \"checkpoints\" lists no files");

  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  fs::path base = parent;
  if (ds.contains("base_dir")) {
    if (!ds["base_dir"].is_string()) return invalid_argument(path + ": \"base_dir\" must be a string");
    base = parent / ds["base_dir"].get<std::string>();  // an absolute base_dir replaces parent
    std::error_code ec;
    if (!fs::is_directory(base, ec)) return not_found(path + ": base_dir " + base.string() + " is not a directory");
  }
  out.base_dir = base.string();
  std::set<std::string> seen;
  for (auto [list, resolved] : {std::pair{&names, &out.files}, std::pair{&tp_names, &out.tp_files}}) {
    for (const auto& name : *list) {
      const fs::path f = base / name;
      if (!seen.insert(f.lexically_normal().string()).second) continue;
      TESSERA_ASSIGN_OR_RETURN(bool present, input_path_exists(f.string()));
      if (!present) return not_found(path + ": checkpoint file " + f.string() + " does not exist");
      resolved->push_back(f.string());
    }
  }
  return out;
}

}  // namespace tessera
