#include "common/safetensors.h"

#include "common/input_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

namespace tessera {
namespace {

// The reference implementation refuses headers above 100 MB; a larger length is a corrupt file,
// and refusing it early avoids parsing garbage.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct StoredDType {
  const char* name;
  size_t size;
  std::optional<DType> dtype;  // nullopt: valid safetensors type Tessera cannot compute with
};

constexpr StoredDType kStoredDTypes[] = {
    {"F32", 4, DType::kF32},   {"F16", 2, DType::kF16},      {"BF16", 2, DType::kBF16},
    {"I32", 4, DType::kI32},   {"I64", 8, DType::kI64},      {"U8", 1, DType::kU8},
    {"F64", 8, std::nullopt},  {"I8", 1, std::nullopt},      {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},  {"U32", 4, std::nullopt},     {"U64", 8, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

const StoredDType* lookup_dtype(const std::string& s) {
  for (const auto& d : kStoredDTypes)
    if (s == d.name) return &d;
  return nullptr;
}

std::string safetensors_errno_text() { return std::strerror(errno); }

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kI8: return "I8";
  }
  return "?";
}

StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block the open
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such file");
    return invalid_argument(path + ": cannot open: " + safetensors_errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = safetensors_errno_text();
    ::close(fd);
    return invalid_argument(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": is " + describe_non_regular(st.st_mode) + ", not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return data_loss(path + ": truncated safetensors file (" + std::to_string(size) +
                     " bytes, shorter than the 8-byte header length)");
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string mmap_err = safetensors_errno_text();
  ::close(fd);  // the mapping keeps the file open
  if (base == MAP_FAILED) return internal_error(path + ": mmap failed: " + mmap_err);

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->base_ = base;
  file->size_ = size;

  uint64_t header_len = 0;
  const auto* bytes = static_cast<const unsigned char*>(base);
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > size - 8) {
    return data_loss(path + ": truncated safetensors file: header length " + std::to_string(header_len) +
                     " exceeds the " + std::to_string(size - 8) + " bytes after the length field");
  }
  if (header_len > kMaxHeaderBytes) {
    return data_loss(path + ": safetensors header length " + std::to_string(header_len) +
                     " is implausibly large (limit 100 MB)");
  }
  TESSERA_RETURN_IF_ERROR(file->parse_header(static_cast<size_t>(header_len)));
  return file;
}

Status SafetensorsFile::parse_header(size_t header_len) {
  const char* text = static_cast<const char*>(base_) + 8;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_len);
  } catch (const nlohmann::json::parse_error& e) {
    return data_loss(path_ + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return data_loss(path_ + ": safetensors header is not a JSON object");

  const size_t data_start = 8 + header_len;
  const size_t data_size = size_ - data_start;
  const char* data_base = static_cast<const char*>(base_) + data_start;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return data_loss(path_ + ": \"__metadata__\" is not a JSON object");
      metadata_ = entry;
      continue;
    }
    const std::string where = path_ + ": tensor '" + name + "'";
    if (!entry.is_object()) return data_loss(where + ": header entry is not a JSON object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return data_loss(where + ": missing or non-string \"dtype\"");
    if (sh == entry.end() || !sh->is_array()) return data_loss(where + ": missing or non-array \"shape\"");
    if (off == entry.end() || !off->is_array() || off->size() != 2)
      return data_loss(where + ": \"data_offsets\" must be an array [begin, end]");

    TensorInfo info;
    info.name = name;
    info.file = path_;
    info.stored_dtype = dt->get<std::string>();
    const StoredDType* stored = lookup_dtype(info.stored_dtype);
    if (stored == nullptr)
      return unimplemented(where + ": unknown dtype \"" + info.stored_dtype + "\"");
    info.dtype_supported = stored->dtype.has_value();
    info.dtype = stored->dtype.value_or(DType::kU8);

    // numel * element size, refusing overflow: a lying header must not wrap around.
    uint64_t nbytes = stored->size;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        return data_loss(where + ": shape " + sh->dump() + " has a negative or non-integer dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(nbytes, dim, &nbytes))
        return data_loss(where + ": shape " + sh->dump() + " is too large");
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      return data_loss(where + ": data_offsets " + off->dump() + " are not non-negative integers");
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return data_loss(where + ": data_offsets " + off->dump() + " lie outside the data section of " +
                       std::to_string(data_size) + " bytes (file truncated or header corrupt)");
    }
    if (end - begin != nbytes) {
      return data_loss(where + ": data_offsets " + off->dump() + " span " + std::to_string(end - begin) +
                       " bytes but dtype " + info.stored_dtype + " and shape " + sh->dump() + " need " +
                       std::to_string(nbytes));
    }
    info.data = data_base + begin;
    info.nbytes = static_cast<size_t>(nbytes);
    by_name_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // Overlapping tensors would alias each other's weights: a corrupt or hostile header.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_)
    if (t.nbytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    if (static_cast<const char*>(prev->data) + prev->nbytes > by_offset[i]->data) {
      return data_loss(path_ + ": tensors '" + prev->name + "' and '" + by_offset[i]->name +
                       "' have overlapping data_offsets");
    }
  }
  return Status::ok();
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::release(const void* data, size_t nbytes) const { release_mapped_pages(data, nbytes); }

}  // namespace tessera
