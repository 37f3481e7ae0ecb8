#include "common/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/checkpoint/deepspeed_json.h"
#include "common/checkpoint/torch_checkpoint.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_tensor_rows.h"
#include "common/input_file.h"
#include "common/string_util.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";
constexpr const char* kTorchIndex = "pytorch_model.bin.index.json";
constexpr const char* kTorchSingle = "pytorch_model.bin";

bool is_safetensors_name(const fs::path& p) { return ascii_lower(p.extension().string()) == ".safetensors"; }

// For the refusal of a folder that holds no Hugging Face checkpoint but GGUF files (a llama.cpp
// user's models folder): which ones, and that the file itself is the model. Empty without any.
std::string gguf_files_hint(const fs::path& dir) {
  std::vector<std::string> ggufs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (is_gguf_path(e.path().string())) ggufs.push_back(e.path().filename().string());
  }
  if (ggufs.empty()) return "";
  std::sort(ggufs.begin(), ggufs.end());
  std::string listed;
  for (size_t i = 0; i < ggufs.size() && i < 3; ++i) listed += (i ? ", " : "") + ggufs[i];
  if (ggufs.size() > 3) listed += ", ... (" + std::to_string(ggufs.size()) + " in all)";
  return "; the folder holds GGUF files (" + listed +
         "): give the .gguf file itself as the model (of a split model, its first part)";
}
bool is_torch_name(const fs::path& p) {
  const std::string ext = ascii_lower(p.extension().string());
  return ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt";
}

// The format is told by the file's first bytes, not its name: DeepSpeed JSONs and users
// name PyTorch files .bin, .pt, .pth or anything else.
StatusOr<std::shared_ptr<WeightFile>> open_weight_file(const std::string& path) {
  if (is_safetensors_name(path)) {
    TESSERA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path));
    return std::shared_ptr<WeightFile>(std::move(f));
  }
  {
    TESSERA_ASSIGN_OR_RETURN(const std::string first, read_input_file_head(path, "the checkpoint file", 16));
    const char* head = first.data();
    const size_t got = first.size();
    if (looks_like_torch_checkpoint(head, got)) {
      TESSERA_ASSIGN_OR_RETURN(auto f, TorchCheckpointFile::open(path));
      return std::shared_ptr<WeightFile>(std::move(f));
    }
    // A safetensors file starts with an 8-byte header length and then '{'.
    if (got >= 9 && head[8] == '{') {
      TESSERA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path));
      return std::shared_ptr<WeightFile>(std::move(f));
    }
  }
  return invalid_argument(path + ": neither a safetensors file nor a PyTorch checkpoint (torch.save zip or legacy format)");
}

}  // namespace

Status Checkpoint::load_config(const std::string& dir) {
  fs::path config = fs::path(dir) / "config.json";
  TESSERA_ASSIGN_OR_RETURN(bool present, input_path_exists(config.string()));
  if (!present) return not_found(config.string() + ": no such file (a model folder needs config.json)");
  TESSERA_ASSIGN_OR_RETURN(config_, read_input_json(config.string(), "config.json"));
  if (!config_.is_object()) return invalid_argument(config.string() + ": config.json is not a JSON object");
  config_dir_ = dir;
  return Status::ok();
}

Status Checkpoint::add_file(const std::string& file_path, bool presharded_tp) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<WeightFile> file, open_weight_file(file_path));
  std::shared_ptr<const void> owner = file;
  for (const TensorInfo& info : file->tensors()) {
    auto [it, inserted] = tensors_.emplace(info.name, Entry{&info, file.get(), owner});
    if (!inserted && presharded_tp) {
      return unimplemented(path_ + ": pre-sharded DeepSpeed checkpoints (\"checkpoints\": {\"non_tp\", \"tp\"} whose tp "
                           "files each hold a rank's cut, here of '" + info.name + "' in " + it->second.file->path() +
                           " and " + file_path + ") are not supported. Point the model at the original checkpoint (a "
                           "Hugging Face folder, or a checkpoint JSON listing its files) and set the tensor-parallel "
                           "size: Tessera slices whole tensors per rank itself");
    }
    if (!inserted) {
      return data_loss("tensor '" + info.name + "' appears in two checkpoint files: " + it->second.file->path() +
                       " and " + file_path);
    }
    total_bytes_ += static_cast<int64_t>(info.nbytes);
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

// Shards named by an index's "weight_map" (model.safetensors.index.json, or
// pytorch_model.bin.index.json as transformers writes for .bin shards).
Status Checkpoint::add_indexed_files(const std::string& dir, const std::string& index_name) {
  const fs::path index = fs::path(dir) / index_name;
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json idx, read_input_json(index.string(), "checkpoint index"));
  if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
    return invalid_argument(index.string() + ": missing \"weight_map\" object");
  std::set<std::string> shard_names;
  for (const auto& [tensor, file] : idx["weight_map"].items()) {
    if (!file.is_string()) return invalid_argument(index.string() + ": weight_map." + tensor + " is not a file name");
    std::string shard = file.get<std::string>();
    if (shard_names.insert(shard).second) {
      fs::path shard_path = fs::path(dir) / shard;
      TESSERA_ASSIGN_OR_RETURN(bool present, input_path_exists(shard_path.string()));
      if (!present) {
        return not_found(index.string() + " names " + shard + " (for tensor '" + tensor + "'), but " +
                         shard_path.string() + " does not exist");
      }
    }
  }
  for (const auto& shard : shard_names) TESSERA_RETURN_IF_ERROR(add_file((fs::path(dir) / shard).string()));
  // The index is a promise about where each tensor lives; a mismatch means a stale or
  // mixed-up folder, which would otherwise surface later as a confusing missing weight.
  for (const auto& [tensor, file] : idx["weight_map"].items()) {
    const TensorInfo* info = find(tensor);
    if (info == nullptr || fs::path(info->file).filename() != fs::path(file.get<std::string>()).filename()) {
      return data_loss(index.string() + ": tensor '" + tensor + "' is listed in " + file.get<std::string>() +
                       " but that file does not contain it");
    }
  }
  return Status::ok();
}

Status Checkpoint::open_deepspeed_json(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(DeepSpeedCheckpoint ds, read_deepspeed_json(path));
  // The type names a model family; whether it is one Tessera serves is the architecture
  // table's call (open_model_checkpoint in worker/model_checkpoint.h).
  ds_type_ = ds.type;
  for (const auto& f : ds.files) TESSERA_RETURN_IF_ERROR(add_file(f));
  for (const auto& f : ds.tp_files) TESSERA_RETURN_IF_ERROR(add_file(f, true));
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  const fs::path base(ds.base_dir);
  TESSERA_ASSIGN_OR_RETURN(bool in_base, input_path_exists((base / "config.json").string()));
  TESSERA_ASSIGN_OR_RETURN(bool in_parent, input_path_exists((parent / "config.json").string()));
  const fs::path config_dir = in_base ? base : parent;
  if (!in_base && !in_parent) {
    return not_found(path + ": no config.json in " + base.string() +
                     (base == parent ? "" : " or " + parent.string()) + " (the architecture is read from it)");
  }
  return load_config(config_dir.string());
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  std::error_code ec;
  TESSERA_ASSIGN_OR_RETURN(bool present, input_path_exists(path));
  if (!present) return not_found(path + ": no such file or directory");
  fs::file_status st = fs::status(path, ec);
  if (ec) return invalid_argument(path + ": cannot look it up (" + ec.message() + ")");

  if (fs::is_directory(st)) {
    // Hugging Face folder: safetensors first (the same weights, and no pickle to read) when
    // a folder has both, as transformers prefers them.
    const fs::path dir(path);
    if (Status config = ckpt->load_config(path); !config.is_ok()) {
      if (config.code() != StatusCode::kNotFound) return config;
      return not_found(config.message() + gguf_files_hint(dir));
    }
    // Each lookup may fail (a symlink loop, no permission): an error then, not "absent".
    auto has = [&dir](const char* name) { return input_path_exists((dir / name).string()); };
    TESSERA_ASSIGN_OR_RETURN(bool has_index, has(kSafetensorsIndex));
    TESSERA_ASSIGN_OR_RETURN(bool has_single, has("model.safetensors"));
    TESSERA_ASSIGN_OR_RETURN(bool has_torch_index, has(kTorchIndex));
    TESSERA_ASSIGN_OR_RETURN(bool has_torch_single, has(kTorchSingle));
    if (has_index) {
      TESSERA_RETURN_IF_ERROR(ckpt->add_indexed_files(path, kSafetensorsIndex));
      return ckpt;
    }
    if (has_single) {
      TESSERA_RETURN_IF_ERROR(ckpt->add_file((dir / "model.safetensors").string()));
      return ckpt;
    }
    std::vector<std::string> found, other;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (is_safetensors_name(e.path())) found.push_back(e.path().string());
      if (is_torch_name(e.path())) other.push_back(e.path().filename().string());
    }
    std::sort(found.begin(), found.end());
    std::sort(other.begin(), other.end());
    if (!found.empty()) {
      for (const auto& f : found) TESSERA_RETURN_IF_ERROR(ckpt->add_file(f));
      return ckpt;
    }
    if (has_torch_index) {
      TESSERA_RETURN_IF_ERROR(ckpt->add_indexed_files(path, kTorchIndex));
      return ckpt;
    }
    if (has_torch_single) {
      TESSERA_RETURN_IF_ERROR(ckpt->add_file((dir / kTorchSingle).string()));
      return ckpt;
    }
    // Other .bin files (training_args.bin, optimizer states) are not weights: not guessed at.
    std::string listed;
    for (size_t i = 0; i < other.size() && i < 4; ++i) listed += (i ? ", " : "") + other[i];
    return not_found(path + ": no model weights in the folder (looked for model.safetensors[.index.json], *.safetensors, " +
                     kTorchSingle + " and " + kTorchIndex + ")" +
                     (other.empty() ? "" : "; to load " + listed + ", list it in a DeepSpeed checkpoint JSON") +
                     gguf_files_hint(dir));
  }

  fs::path file(path);
  std::string ext = ascii_lower(file.extension().string());
  fs::path parent = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  if (ext == ".json") {
    TESSERA_RETURN_IF_ERROR(ckpt->open_deepspeed_json(path));
    return ckpt;
  }
  // A single weights file (safetensors or PyTorch), config.json beside it.
  TESSERA_RETURN_IF_ERROR(ckpt->load_config(parent.string()));
  TESSERA_RETURN_IF_ERROR(ckpt->add_file(path));
  return ckpt;
}

std::unique_ptr<Checkpoint> Checkpoint::from_weight_file(const std::string& path, nlohmann::json config,
                                                         std::shared_ptr<WeightFile> file) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  const fs::path parent = fs::path(path).parent_path();
  ckpt->config_dir_ = parent.empty() ? "." : parent.string();
  ckpt->config_ = std::move(config);
  ckpt->from_gguf_ = true;
  std::shared_ptr<const void> owner = file;
  for (const TensorInfo& info : file->tensors()) {
    ckpt->tensors_.emplace(info.name, Entry{&info, file.get(), owner});
    ckpt->total_bytes_ += static_cast<int64_t>(info.nbytes);
  }
  ckpt->files_.push_back(std::move(file));
  return ckpt;
}

bool Checkpoint::add_missing_prefix(const std::string& prefix, const std::vector<std::string>& outside) {
  if (prefix.empty() || tensors_.empty()) return false;
  for (const auto& [name, e] : tensors_) {
    if (name.rfind(prefix, 0) == 0) return false;
  }
  // The TensorInfo keeps the name as stored (errors about the file quote it as the file has it).
  std::unordered_map<std::string, Entry> renamed;
  for (auto& [name, e] : tensors_) {
    const bool keep = std::find(outside.begin(), outside.end(), name) != outside.end();
    renamed.emplace(keep ? name : prefix + name, std::move(e));
  }
  tensors_ = std::move(renamed);
  return true;
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

// A non-contiguous (strided) PyTorch tensor: elements [begin, begin + count) along `axis`
// copied into a contiguous tensor, a row of the last dimension at a time where that
// dimension is dense (stride 1), else element by element. Only the slice's elements are read.
Tensor gather_strided(const TensorInfo& info, DType dtype, int axis, int64_t begin, int64_t count) {
  std::vector<int64_t> out_dims = info.shape;
  if (axis >= 0) out_dims[axis] = count;
  Tensor out = Tensor::zeros(out_dims, dtype);
  int64_t total = 1;
  for (int64_t d : out_dims) total *= d;
  if (total == 0) return out;
  const size_t src_size = dtype_size(info.dtype), dst_size = dtype_size(dtype);
  const char* src = static_cast<const char*>(info.data);
  if (axis >= 0) src += begin * info.strides[axis] * static_cast<int64_t>(src_size);
  char* dst = out.data<char>();
  const size_t nd = out_dims.size();
  const int64_t row = nd == 0 ? 1 : out_dims[nd - 1];
  const bool dense_rows = nd == 0 || info.strides[nd - 1] == 1;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t done = 0; done < total; done += row) {
    int64_t at = 0;  // element offset of this row's first element
    for (size_t i = 0; i + 1 < nd; ++i) at += idx[i] * info.strides[i];
    if (dense_rows) {
      convert_elements(src + at * static_cast<int64_t>(src_size), info.dtype, dst, dtype, static_cast<size_t>(row));
    } else {
      for (int64_t j = 0; j < row; ++j) {
        convert_elements(src + (at + j * info.strides[nd - 1]) * static_cast<int64_t>(src_size), info.dtype,
                         dst + j * static_cast<int64_t>(dst_size), dtype, 1);
      }
    }
    dst += row * static_cast<int64_t>(dst_size);
    for (size_t i = nd == 0 ? 0 : nd - 1; i-- > 0;) {  // odometer over all but the last dimension
      if (++idx[i] < out_dims[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

}  // namespace

StatusOr<Tensor> Checkpoint::load(const std::string& name, DType dtype) const {
  TESSERA_ASSIGN_OR_RETURN(const Entry* e, entry(name, dtype));
  if (needs_ggml_row_decoding(*e->info)) return decode_ggml_rows(*e->info, dtype, -1, 0, 0);
  if (!e->info->contiguous()) return gather_strided(*e->info, dtype, -1, 0, 0);
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
  if (needs_ggml_row_decoding(*e->info)) return decode_ggml_rows(*e->info, dtype, axis, begin, count);
  if (!e->info->contiguous()) return gather_strided(*e->info, dtype, axis, begin, count);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<int64_t> out_dims = shape;
  out_dims[axis] = count;
  return gather(*e->info, e->owner, dtype, out_dims, outer, count * inner, shape[axis] * inner, begin * inner);
}

StatusOr<Tensor> Checkpoint::load_blocks(const std::string& name, int axis, int64_t begin, int64_t count,
                                         RecycledBuffers* scratch) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) return not_found("checkpoint has no tensor \"" + name + "\"");
  if (!stored_in_ggml_blocks(*info) || info->shape.size() != 2) {
    return internal_error("tensor '" + name + "' is not a matrix of ggml blocks");
  }
  if (axis >= 0 && (axis > 1 || begin < 0 || count < 0 || begin > info->shape[static_cast<size_t>(axis)] - count)) {
    return invalid_argument("tensor '" + name + "': slice [" + std::to_string(begin) + ", " +
                            std::to_string(begin + count) + ") along axis " + std::to_string(axis) + " is out of range");
  }
  // Whole rows in their stored order are one contiguous run of the file: borrowed, not copied.
  if (info->row_order.empty() && axis != 1) {
    const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(info->ggml_type));
    const int64_t row_bytes = info->shape[1] / traits->block_elems * traits->block_bytes;
    const int64_t first = axis == 0 ? begin : 0, rows = axis == 0 ? count : info->shape[0];
    const char* p = static_cast<const char*>(info->data) + first * row_bytes;
    return Tensor::borrowed(TensorView(const_cast<char*>(p), DType::kU8, {rows, row_bytes}), tensors_.at(name).owner);
  }
  return ggml_block_rows(*info, axis, begin, count, scratch);
}

void Checkpoint::release(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return;
  it->second.file->release(it->second.info->data, it->second.info->nbytes);
}

void Checkpoint::release_all() const {
  std::unordered_map<const WeightFile*, std::pair<const char*, const char*>> spans;
  for (const auto& [name, e] : tensors_) {
    const auto* begin = static_cast<const char*>(e.info->data);
    auto [it, fresh] = spans.emplace(e.file, std::make_pair(begin, begin + e.info->nbytes));
    it->second.first = std::min(it->second.first, begin);
    it->second.second = std::max(it->second.second, begin + e.info->nbytes);
  }
  for (const auto& [file, span] : spans) file->release(span.first, static_cast<size_t>(span.second - span.first));
}

std::shared_ptr<const WeightFile> Checkpoint::file_holding(const void* data, size_t nbytes) const {
  for (const auto& file : files_)
    if (file->whole_mapping().holds(data, nbytes)) return file;
  return nullptr;
}

}  // namespace tessera
