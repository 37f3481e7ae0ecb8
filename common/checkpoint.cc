#include "common/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/string_util.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

bool is_safetensors_name(const fs::path& p) { return ascii_lower(p.extension().string()) == ".safetensors"; }

Status only_safetensors(const std::string& file) {
  return unimplemented(file + ": only safetensors checkpoints are supported (convert PyTorch .bin/.pt files "
                              "with the `safetensors` library first)");
}

StatusOr<nlohmann::json> read_json(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path.string() + ": cannot read " + what);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument(path.string() + ": " + what + " is not valid JSON: " + e.what());
  }
}

// "checkpoints": ["a.safetensors", ...] or, as DeepSpeed writes for pre-sharded models,
// {"non_tp": [...], "tp": [...]}; all files together hold the whole model.
Status collect_ds_files(const nlohmann::json& node, const std::string& where, std::vector<std::string>* out) {
  if (node.is_string()) {
    out->push_back(node.get<std::string>());
    return Status::ok();
  }
  if (node.is_array()) {
    for (const auto& item : node) {
      if (!item.is_string()) return invalid_argument(where + ": \"checkpoints\" entries must be file names, got " + item.dump());
      out->push_back(item.get<std::string>());
    }
    return Status::ok();
  }
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      if (!value.is_array() && !value.is_string())
        return invalid_argument(where + ": \"checkpoints\"." + key + " must be a list of file names");
      TESSERA_RETURN_IF_ERROR(collect_ds_files(value, where, out));
    }
    return Status::ok();
  }
  return invalid_argument(where + ": \"checkpoints\" must be a list of file names or a {\"tp\": [...]} object");
}

}  // namespace

Status Checkpoint::load_config(const std::string& dir) {
  fs::path config = fs::path(dir) / "config.json";
  if (!fs::exists(config)) return not_found(config.string() + ": no such file (a model folder needs config.json)");
  TESSERA_ASSIGN_OR_RETURN(config_, read_json(config, "config.json"));
  if (!config_.is_object()) return invalid_argument(config.string() + ": config.json is not a JSON object");
  config_dir_ = dir;
  return Status::ok();
}

Status Checkpoint::add_file(const std::string& file_path) {
  TESSERA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(file_path));
  std::shared_ptr<const void> owner = file;
  for (const TensorInfo& info : file->tensors()) {
    auto [it, inserted] = tensors_.emplace(info.name, Entry{&info, file.get(), owner});
    if (!inserted) {
      return data_loss("tensor '" + info.name + "' appears in two checkpoint files: " + it->second.file->path() +
                       " and " + file_path);
    }
    total_bytes_ += static_cast<int64_t>(info.nbytes);
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found(path + ": no such file or directory");

  if (fs::is_directory(st)) {
    // Hugging Face folder.
    TESSERA_RETURN_IF_ERROR(ckpt->load_config(path));
    fs::path index = fs::path(path) / kIndexName;
    if (fs::exists(index)) {
      TESSERA_ASSIGN_OR_RETURN(nlohmann::json idx, read_json(index, "safetensors index"));
      if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
        return invalid_argument(index.string() + ": missing \"weight_map\" object");
      std::set<std::string> shard_names;
      for (const auto& [tensor, file] : idx["weight_map"].items()) {
        if (!file.is_string()) return invalid_argument(index.string() + ": weight_map." + tensor + " is not a file name");
        std::string shard = file.get<std::string>();
        if (shard_names.insert(shard).second) {
          fs::path shard_path = fs::path(path) / shard;
          if (!is_safetensors_name(shard_path)) return only_safetensors(shard_path.string());
          if (!fs::exists(shard_path)) {
            return not_found(index.string() + " names " + shard + " (for tensor '" + tensor +
                             "'), but " + shard_path.string() + " does not exist");
          }
        }
      }
      for (const auto& shard : shard_names) TESSERA_RETURN_IF_ERROR(ckpt->add_file((fs::path(path) / shard).string()));
      // The index is a promise about where each tensor lives; a mismatch means a stale or
      // mixed-up folder, which would otherwise surface later as a confusing missing weight.
      for (const auto& [tensor, file] : idx["weight_map"].items()) {
        const TensorInfo* info = ckpt->find(tensor);
        if (info == nullptr || fs::path(info->file).filename() != fs::path(file.get<std::string>()).filename()) {
          return data_loss(index.string() + ": tensor '" + tensor + "' is listed in " + file.get<std::string>() +
                           " but that file does not contain it");
        }
      }
    } else if (fs::exists(fs::path(path) / "model.safetensors")) {
      TESSERA_RETURN_IF_ERROR(ckpt->add_file((fs::path(path) / "model.safetensors").string()));
    } else {
      std::vector<std::string> found, other;
      for (const auto& e : fs::directory_iterator(path, ec)) {
        std::string ext = ascii_lower(e.path().extension().string());
        if (ext == ".safetensors") found.push_back(e.path().string());
        if (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt") other.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty() && !other.empty()) return only_safetensors(other.front());
      if (found.empty()) return not_found(path + ": no *.safetensors files in the model folder");
      for (const auto& f : found) TESSERA_RETURN_IF_ERROR(ckpt->add_file(f));
    }
    return ckpt;
  }

  fs::path file(path);
  std::string ext = ascii_lower(file.extension().string());
  fs::path parent = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  if (ext == ".safetensors") {  // a single file, config.json beside it
    TESSERA_RETURN_IF_ERROR(ckpt->load_config(parent.string()));
    TESSERA_RETURN_IF_ERROR(ckpt->add_file(path));
    return ckpt;
  }
  if (ext != ".json") return only_safetensors(path);

  // DeepSpeed checkpoint JSON.
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json ds, read_json(file, "DeepSpeed checkpoint JSON"));
  if (!ds.is_object()) return invalid_argument(path + ": DeepSpeed checkpoint JSON is not an object");
  if (!ds.contains("checkpoints")) return invalid_argument(path + ": DeepSpeed checkpoint JSON lacks \"checkpoints\"");
  if (!ds.contains("type") || !ds["type"].is_string())
    return invalid_argument(path + ": DeepSpeed checkpoint JSON lacks a string \"type\"");
  // The type names a model family; whether it is one Tessera serves is the architecture
  // table's call (open_model_checkpoint in worker/model_checkpoint.h).
  ckpt->ds_type_ = ds["type"].get<std::string>();
  fs::path base = parent;
  if (ds.contains("base_dir")) {
    if (!ds["base_dir"].is_string()) return invalid_argument(path + ": \"base_dir\" must be a string");
    base = parent / ds["base_dir"].get<std::string>();  // an absolute base_dir replaces parent
    if (!fs::is_directory(base)) return not_found(path + ": base_dir " + base.string() + " is not a directory");
  }
  std::vector<std::string> names;
  TESSERA_RETURN_IF_ERROR(collect_ds_files(ds["checkpoints"], path, &names));
  if (names.empty()) return invalid_argument(path + ": \"checkpoints\" lists no files");
  std::set<std::string> seen;
  for (const auto& name : names) {
    fs::path f = base / name;
    if (!seen.insert(f.lexically_normal().string()).second) continue;
    if (!is_safetensors_name(f)) return only_safetensors(f.string());
    if (!fs::exists(f)) return not_found(path + ": checkpoint file " + f.string() + " does not exist");
  }
  seen.clear();
  for (const auto& name : names) {
    fs::path f = base / name;
    if (seen.insert(f.lexically_normal().string()).second) TESSERA_RETURN_IF_ERROR(ckpt->add_file(f.string()));
  }
  fs::path config_dir = fs::exists(base / "config.json") ? base : parent;
  if (!fs::exists(config_dir / "config.json")) {
    return not_found(path + ": no config.json in " + base.string() +
                     (base == parent ? "" : " or " + parent.string()) + " (the architecture is read from it)");
  }
  TESSERA_RETURN_IF_ERROR(ckpt->load_config(config_dir.string()));
  return ckpt;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.info;
}

StatusOr<const Checkpoint::Entry*> Checkpoint::entry(const std::string& name, DType dtype) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found("tensor '" + name + "' not found in checkpoint " + path_);
  const TensorInfo& info = *it->second.info;
  if (!info.dtype_supported) {
    return unimplemented(info.file + ": tensor '" + name + "' has dtype " + info.stored_dtype +
                         ", which is not supported (weights must be F32, F16 or BF16)");
  }
  auto is_float = [](DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; };
  if (info.dtype != dtype && !(is_float(info.dtype) && is_float(dtype))) {
    return unimplemented(info.file + ": tensor '" + name + "' has dtype " + info.stored_dtype +
                         ", which cannot be converted to " + dtype_name(dtype));
  }
  if (info.shape.size() > static_cast<size_t>(kMaxTensorDims)) {
    return unimplemented(info.file + ": tensor '" + name + "' has " + std::to_string(info.shape.size()) +
                         " dimensions; at most " + std::to_string(kMaxTensorDims) + " are supported");
  }
  return &it->second;
}

namespace {

// `outer` runs of `run` elements each, the o-th starting at element offset + o * stride of the
// stored tensor. One contiguous run in the stored dtype is borrowed rather than copied.
Tensor gather(const TensorInfo& info, const std::shared_ptr<const void>& owner, DType dtype,
              const std::vector<int64_t>& out_dims, int64_t outer, int64_t run, int64_t stride, int64_t offset) {
  const size_t src_size = dtype_size(info.dtype);
  const char* src = static_cast<const char*>(info.data);
  if (run == stride) {  // the runs are adjacent: one contiguous block
    run *= outer;
    outer = 1;
  }
  if (outer <= 1 && info.dtype == dtype) {
    const char* p = src + offset * src_size;
    if (reinterpret_cast<uintptr_t>(p) % src_size == 0) {
      return Tensor::borrowed(TensorView(const_cast<char*>(p), dtype, out_dims), owner);
    }
  }
  Tensor out = Tensor::zeros(out_dims, dtype);
  char* dst = out.data<char>();
  const size_t dst_size = dtype_size(dtype);
  for (int64_t o = 0; o < outer; ++o) {
    convert_elements(src + (offset + o * stride) * src_size, info.dtype, dst + o * run * dst_size, dtype,
                     static_cast<size_t>(run));
  }
  return out;
}

}  // namespace

StatusOr<Tensor> Checkpoint::load(const std::string& name, DType dtype) const {
  TESSERA_ASSIGN_OR_RETURN(const Entry* e, entry(name, dtype));
  int64_t n = e->info->numel();
  return gather(*e->info, e->owner, dtype, e->info->shape, 1, n, n, 0);
}

StatusOr<Tensor> Checkpoint::load_slice(const std::string& name, DType dtype, int axis, int64_t begin,
                                        int64_t count) const {
  TESSERA_ASSIGN_OR_RETURN(const Entry* e, entry(name, dtype));
  const std::vector<int64_t>& shape = e->info->shape;
  std::ostringstream dims;
  for (size_t i = 0; i < shape.size(); ++i) dims << (i ? ", " : "") << shape[i];
  const std::string where = "tensor '" + name + "' of shape [" + dims.str() + "]";
  if (axis < 0 || axis >= static_cast<int>(shape.size()))
    return invalid_argument(where + ": cannot slice along axis " + std::to_string(axis));
  if (begin < 0 || count < 0 || begin > shape[axis] - count) {
    return invalid_argument(where + ": slice [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                            ") along axis " + std::to_string(axis) + " is out of range");
  }
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<int64_t> out_dims = shape;
  out_dims[axis] = count;
  return gather(*e->info, e->owner, dtype, out_dims, outer, count * inner, shape[axis] * inner, begin * inner);
}

void Checkpoint::release(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return;
  it->second.file->release(it->second.info->data, it->second.info->nbytes);
}

}  // namespace tessera
