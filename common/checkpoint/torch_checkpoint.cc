#include "common/checkpoint/torch_checkpoint.h"

#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "common/checkpoint/pickle_reader.h"
#include "common/checkpoint/zip_reader.h"

namespace tessera {
namespace {

using K = PickleValue::Kind;

struct StorageType {
  const char* name;  // the class in `torch`
  size_t size;       // bytes per element
  std::optional<DType> dtype;  // nullopt: listed (sizes checked) but not computable
};

constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", 4, DType::kF32},   {"HalfStorage", 2, DType::kF16},     {"BFloat16Storage", 2, DType::kBF16},
    {"IntStorage", 4, DType::kI32},     {"LongStorage", 8, DType::kI64},     {"ByteStorage", 1, DType::kU8},
    {"DoubleStorage", 8, std::nullopt}, {"CharStorage", 1, std::nullopt},    {"ShortStorage", 2, std::nullopt},
    {"BoolStorage", 1, std::nullopt},   {"ComplexFloatStorage", 8, std::nullopt},
    {"ComplexDoubleStorage", 16, std::nullopt},
};

const StorageType* storage_type(const std::string& global) {
  for (const auto& t : kStorageTypes)
    if (global == std::string("torch.") + t.name) return &t;
  return nullptr;
}

constexpr const char* kRebuildTensorV2 = "torch._utils._rebuild_tensor_v2";
constexpr const char* kRebuildTensor = "torch._utils._rebuild_tensor";
constexpr const char* kRebuildParameter = "torch._utils._rebuild_parameter";
constexpr const char* kRebuildParameterWithState = "torch._utils._rebuild_parameter_with_state";

const PickleOptions& torch_pickle_options() {
  static const PickleOptions options = [] {
    PickleOptions o;
    o.callable_globals = {"collections.OrderedDict", kRebuildTensorV2, kRebuildTensor, kRebuildParameter,
                          kRebuildParameterWithState};
    o.allowed_globals = o.callable_globals;
    for (const auto& t : kStorageTypes) o.allowed_globals.insert(std::string("torch.") + t.name);
    return o;
  }();
  return options;
}

// The legacy format's first pickle: torch.serialization's MAGIC_NUMBER
// 0x1950a86a20f9469cfc6c as pickle's little-endian LONG1 bytes.
constexpr unsigned char kLegacyMagic[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
constexpr int64_t kLegacyProtocolVersion = 1001;

struct StorageRef {
  std::string key;
  const StorageType* type = nullptr;
  int64_t numel = 0;  // elements, as the persistent id says
};

struct TensorSpec {
  std::string name;
  StorageRef storage;
  int64_t offset = 0;  // elements into the storage
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

class StateDictReader {
 public:
  StateDictReader(const std::string& where, bool legacy) : where_(where), legacy_(legacy) {}

  StatusOr<std::vector<TensorSpec>> read(const PickleValue* root) {
    if (root->kind != K::kDict) {
      return invalid_argument(where_ + ": holds a pickled " + std::string(pickle_kind_name(root->kind)) +
                              ", not a state dict (a dict of tensor names to tensors)");
    }
    std::vector<TensorSpec> out;
    std::set<std::string> names;
    for (const auto& [key, value] : root->entries) {
      if (!key->is_string()) return invalid_argument(where_ + ": a state-dict key is a " + std::string(pickle_kind_name(key->kind)) + ", not a tensor name");
      if (!names.insert(key->text).second) return data_loss(where_ + ": tensor '" + key->text + "' appears twice");
      TESSERA_ASSIGN_OR_RETURN(TensorSpec t, tensor(key->text, value));
      out.push_back(std::move(t));
    }
    return out;
  }

  const std::map<std::string, StorageRef>& storages() const { return storages_; }

 private:
  StatusOr<TensorSpec> tensor(const std::string& name, const PickleValue* v) {
    const std::string where = where_ + ": tensor '" + name + "'";
    // nn.Parameter wraps the tensor: _rebuild_parameter(tensor, requires_grad, hooks[, state]).
    if (v->kind == K::kObject && (v->text == kRebuildParameter || v->text == kRebuildParameterWithState)) {
      if (v->items.empty()) return invalid_argument(where + ": " + v->text + " without arguments");
      v = v->items[0];
    }
    if (v->kind != K::kObject || (v->text != kRebuildTensorV2 && v->text != kRebuildTensor)) {
      const std::string what = v->kind == K::kObject ? v->text + "(...)" : pickle_kind_name(v->kind);
      return invalid_argument(where + " holds a " + what + ", not a tensor (Tessera reads state dicts of tensors)");
    }
    // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
    if (v->items.size() < 4) return invalid_argument(where + ": " + v->text + " with " + std::to_string(v->items.size()) + " arguments");
    TensorSpec t;
    t.name = name;
    TESSERA_ASSIGN_OR_RETURN(t.storage, storage(where, v->items[0]));
    if (!v->items[1]->is_int() || v->items[1]->integer < 0) return data_loss(where + ": storage offset is not a non-negative integer");
    t.offset = v->items[1]->integer;
    TESSERA_ASSIGN_OR_RETURN(t.shape, int_tuple(where, "size", v->items[2]));
    TESSERA_ASSIGN_OR_RETURN(t.strides, int_tuple(where, "stride", v->items[3]));
    if (t.shape.size() != t.strides.size())
      return data_loss(where + ": size " + ints_text(t.shape) + " and stride " + ints_text(t.strides) + " differ in length");
    return t;
  }

  StatusOr<std::vector<int64_t>> int_tuple(const std::string& where, const char* what, const PickleValue* v) {
    if (v->kind != K::kTuple) return data_loss(where + ": " + what + " is a " + pickle_kind_name(v->kind) + ", not a tuple");
    std::vector<int64_t> out;
    for (const PickleValue* x : v->items) {
      if (!x->is_int() || x->integer < 0) return data_loss(where + ": " + what + " holds a value that is not a non-negative integer");
      out.push_back(x->integer);
    }
    return out;
  }

  // ('storage', torch.FloatStorage, key, location, numel) — the legacy format adds
  // view_metadata, None unless the tensor was a view of a storage view (torch < 0.4).
  StatusOr<StorageRef> storage(const std::string& where, const PickleValue* v) {
    if (v->kind != K::kPersistent) return data_loss(where + ": its storage is a " + std::string(pickle_kind_name(v->kind)) + ", not a storage reference");
    const PickleValue* pid = v->items[0];
    if (pid->kind != K::kTuple || pid->items.size() < 5 || !pid->items[0]->is_string() || pid->items[0]->text != "storage")
      return data_loss(where + ": its storage reference is not ('storage', type, key, location, size)");
    const auto& f = pid->items;
    if (f[1]->kind != K::kGlobal) return data_loss(where + ": its storage type is not a torch storage class");
    StorageRef ref;
    ref.type = storage_type(f[1]->text);
    if (ref.type == nullptr) return invalid_argument(where + ": storage type " + f[1]->text + " is not supported");
    if (!f[2]->is_string()) return data_loss(where + ": its storage key is not a string");
    ref.key = f[2]->text;
    if (!f[4]->is_int() || f[4]->integer < 0) return data_loss(where + ": its storage size is not a non-negative integer");
    ref.numel = f[4]->integer;
    if (legacy_ && f.size() > 5 && f[5]->kind != K::kNone)
      return unimplemented(where + ": is a view of a storage view (written by torch < 0.4); re-save the checkpoint");
    auto [it, inserted] = storages_.emplace(ref.key, ref);
    if (!inserted && (it->second.type != ref.type || it->second.numel != ref.numel)) {
      return data_loss(where + ": storage " + ref.key + " is referenced with two different types or sizes");
    }
    return ref;
  }

  const std::string& where_;
  bool legacy_;
  std::map<std::string, StorageRef> storages_;
};

// Checks the tensor against its storage and turns it into a view of the mapped bytes.
// `storage_bytes` is how many bytes the file holds for this storage.
StatusOr<TensorInfo> make_info(const TensorSpec& t, const char* storage_data, uint64_t storage_bytes,
                               const std::string& path) {
  const std::string where = path + ": tensor '" + t.name + "'";
  const uint64_t esize = t.storage.type->size;
  uint64_t need_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(t.storage.numel), esize, &need_bytes) || need_bytes > storage_bytes) {
    return data_loss(where + ": storage " + t.storage.key + " should hold " + std::to_string(t.storage.numel) + " " +
                     t.storage.type->name + " elements but the file has only " + std::to_string(storage_bytes) +
                     " bytes for it (file truncated or corrupt)");
  }
  TensorInfo info;
  info.name = t.name;
  info.file = path;
  info.shape = t.shape;
  info.stored_dtype = t.storage.type->name;
  info.dtype_supported = t.storage.type->dtype.has_value();
  info.dtype = t.storage.type->dtype.value_or(DType::kU8);
  // The last element's index: offset + sum (size_i - 1) * stride_i, refusing overflow.
  uint64_t numel = 1, last = static_cast<uint64_t>(t.offset);
  for (size_t i = 0; i < t.shape.size(); ++i) {
    uint64_t step = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(t.shape[i]), &numel) ||
        (t.shape[i] > 0 && (__builtin_mul_overflow(static_cast<uint64_t>(t.shape[i] - 1), static_cast<uint64_t>(t.strides[i]), &step) ||
                            __builtin_add_overflow(last, step, &last)))) {
      return data_loss(where + ": size " + ints_text(t.shape) + " with stride " + ints_text(t.strides) + " is too large");
    }
  }
  if (numel > 0 && last >= static_cast<uint64_t>(t.storage.numel)) {
    return data_loss(where + ": size " + ints_text(t.shape) + ", stride " + ints_text(t.strides) + " and offset " +
                     std::to_string(t.offset) + " reach element " + std::to_string(last) + " but storage " + t.storage.key +
                     " has only " + std::to_string(t.storage.numel) + " elements");
  }
  info.data = storage_data + (numel > 0 ? t.offset * esize : 0);
  info.nbytes = numel > 0 ? static_cast<size_t>((last - t.offset + 1) * esize) : 0;
  TensorInfo probe = info;
  probe.strides = t.strides;
  if (!probe.contiguous()) info.strides = t.strides;  // contiguous tensors read like safetensors ones
  return info;
}

}  // namespace

bool looks_like_torch_checkpoint(const char* data, size_t size) {
  if (looks_like_zip(data, size)) return true;
  // PROTO 2, LONG1 of 10 bytes, the magic number.
  return size >= 4 + sizeof(kLegacyMagic) && static_cast<unsigned char>(data[0]) == 0x80 &&
         static_cast<unsigned char>(data[2]) == 0x8a && data[3] == 10 &&
         std::memcmp(data + 4, kLegacyMagic, sizeof(kLegacyMagic)) == 0;
}

StatusOr<std::shared_ptr<TorchCheckpointFile>> TorchCheckpointFile::open(const std::string& path) {
  std::shared_ptr<TorchCheckpointFile> f(new TorchCheckpointFile());
  TESSERA_ASSIGN_OR_RETURN(f->file_, MappedFile::open(path));
  if (looks_like_zip(f->file_->data(), f->file_->size())) {
    TESSERA_RETURN_IF_ERROR(f->read_zip());
  } else if (looks_like_torch_checkpoint(f->file_->data(), f->file_->size())) {
    f->legacy_ = true;
    TESSERA_RETURN_IF_ERROR(f->read_legacy());
  } else {
    return invalid_argument(path + ": not a PyTorch checkpoint (neither a zip archive nor torch's legacy format)");
  }
  return f;
}

void TorchCheckpointFile::release(const void* data, size_t nbytes) const { release_mapped_pages(data, nbytes); }

Status TorchCheckpointFile::read_zip() {
  const std::string& where = path();
  const char* base = file_->data();
  TESSERA_ASSIGN_OR_RETURN(ZipReader zip, ZipReader::parse(base, file_->size(), where));
  // torch.save names every member "<archive name>/...": find the pickle and take its folder.
  const ZipMember* pkl = nullptr;
  std::string prefix;
  for (const ZipMember& m : zip.members()) {
    const size_t slash = m.name.find('/');
    if (slash != std::string::npos && m.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      pkl = &m;
      prefix = m.name.substr(0, slash + 1);
      break;
    }
  }
  if (pkl == nullptr) {
    return invalid_argument(where + ": a zip archive without <name>/data.pkl, so not a checkpoint written by torch.save" +
                            std::string(zip.find("constants.pkl") != nullptr ? " (a TorchScript archive?)" : ""));
  }
  if (const ZipMember* order = zip.find(prefix + "byteorder")) {
    const std::string bo(base + order->data_offset, order->size);
    if (bo != "little") return unimplemented(where + ": storages are " + bo + "-endian; only little-endian checkpoints are read");
  }
  TESSERA_ASSIGN_OR_RETURN(auto doc, read_pickle(base + pkl->data_offset, pkl->size, torch_pickle_options(), where + " (" + pkl->name + ")"));
  StateDictReader reader(where, false);
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, reader.read(doc->root()));
  for (const TensorSpec& t : specs) {
    const ZipMember* m = zip.find(prefix + "data/" + t.storage.key);
    if (m == nullptr) return data_loss(where + ": tensor '" + t.name + "' needs storage " + prefix + "data/" + t.storage.key + ", which the archive lacks");
    TESSERA_ASSIGN_OR_RETURN(TensorInfo info, make_info(t, base + m->data_offset, m->size, where));
    tensors_.push_back(std::move(info));
  }
  return Status::ok();
}

Status TorchCheckpointFile::read_legacy() {
  const std::string& where = path();
  const char* base = file_->data();
  const size_t size = file_->size();
  size_t pos = 0;
  // Four pickles back to back: magic number, protocol version, system info, the state dict.
  PickleOptions plain;  // the first three name no globals at all
  auto next = [&](const PickleOptions& options, const char* what) -> StatusOr<std::unique_ptr<PickleDocument>> {
    auto doc = read_pickle(base + pos, size - pos, options, where + " (" + what + ")");
    if (doc.is_ok()) pos += doc.value()->consumed();
    return doc;
  };
  TESSERA_ASSIGN_OR_RETURN(auto magic, next(plain, "magic number"));
  (void)magic;  // looks_like_torch_checkpoint checked its bytes
  TESSERA_ASSIGN_OR_RETURN(auto protocol, next(plain, "protocol version"));
  if (!protocol->root()->is_int() || protocol->root()->integer != kLegacyProtocolVersion)
    return invalid_argument(where + ": legacy checkpoint with an unknown protocol version (1001 is read)");
  TESSERA_ASSIGN_OR_RETURN(auto sys_info, next(plain, "system info"));
  if (sys_info->root()->kind == K::kDict) {
    for (const auto& [k, v] : sys_info->root()->entries) {
      if (k->is_string() && k->text == "little_endian" && v->kind == K::kBool && !v->boolean)
        return unimplemented(where + ": written on a big-endian machine; only little-endian checkpoints are read");
    }
  }
  TESSERA_ASSIGN_OR_RETURN(auto state, next(torch_pickle_options(), "state dict"));
  StateDictReader reader(where, true);
  TESSERA_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, reader.read(state->root()));
  TESSERA_ASSIGN_OR_RETURN(auto keys, next(plain, "storage keys"));
  if (keys->root()->kind != K::kList) return data_loss(where + ": the storage key list is missing");

  // Each storage: its element count (int64, little-endian) then its bytes, in key-list order.
  std::map<std::string, std::pair<const char*, uint64_t>> placed;
  for (const PickleValue* k : keys->root()->items) {
    if (!k->is_string()) return data_loss(where + ": a storage key is not a string");
    auto it = reader.storages().find(k->text);
    if (it == reader.storages().end()) return data_loss(where + ": storage " + k->text + " is stored but no tensor names it");
    if (size - pos < 8) return data_loss(where + ": storage " + k->text + " is cut off (file truncated)");
    uint64_t count = 0;
    for (int i = 7; i >= 0; --i) count = (count << 8) | static_cast<unsigned char>(base[pos + i]);
    pos += 8;
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(it->second.type->size), &bytes) || bytes > size - pos) {
      return data_loss(where + ": storage " + k->text + " says " + std::to_string(count) +
                       " elements but the file ends first (file truncated)");
    }
    placed[k->text] = {base + pos, bytes};
    pos += static_cast<size_t>(bytes);
  }
  for (const TensorSpec& t : specs) {
    auto it = placed.find(t.storage.key);
    if (it == placed.end()) return data_loss(where + ": tensor '" + t.name + "' needs storage " + t.storage.key + ", which the file does not hold");
    TESSERA_ASSIGN_OR_RETURN(TensorInfo info, make_info(t, it->second.first, it->second.second, where));
    tensors_.push_back(std::move(info));
  }
  return Status::ok();
}

}  // namespace tessera
