// Reading GGUF bytes: the header, the metadata, the tensor table, then every tensor placed in
// the data section, each step checked against the bytes that are really there before anything
// is allocated or pointed at. Opening from disk and split models are in gguf_split.cc, the
// typed metadata reads in gguf_metadata.cc, the type tables in gguf_types.cc.
#include "common/gguf/gguf_file.h"

#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "common/checkpoint/mapped_file.h"  // ~GgufFile unmaps the parts
#include "common/gguf/gguf_internal.h"

namespace tessera {

std::string gguf_quote(std::string_view s) {
  constexpr size_t kMaxShown = 96;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 || ch == 0x7f) {
      out += "\\x";
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    } else {
      out += static_cast<char>(ch);
    }
  }
  if (s.size() > kMaxShown) out += "...";
  return out + "'";
}

namespace {

// Fields are read with memcpy, which is GGUF's byte order only on a little-endian host.
static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

constexpr uint64_t kGgufDefaultAlignment = 32;
constexpr uint32_t kGgufMaxDims = 4;
// Nested arrays are read recursively; the bound keeps a hostile file from exhausting the stack.
constexpr int kGgufMaxArrayDepth = 16;
// The fewest bytes a metadata pair (empty key, type, one u8) and a tensor info (empty name,
// n_dims, one dimension, type, offset) take: counts from the header are bounded by the bytes
// left before anything is reserved for them.
constexpr uint64_t kGgufMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kGgufMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

std::string gguf_dims_text(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// Bounds-checked little-endian reads over the whole file. `what` says what is being read
// ("the tensor table (tensor 3 of 12 'blk.0.attn_q.weight')"), so a truncation names it.
struct GgufCursor {
  const uint8_t* data;
  size_t size;
  const std::string& file;
  size_t pos = 0;
  std::string what = "the header";

  size_t left() const { return size - pos; }
  Status truncated(size_t need) const {
    return data_loss(file + ": truncated reading " + what + " at byte " + std::to_string(pos + need) + " of " +
                     std::to_string(size));
  }
  Status error(const std::string& message) const { return data_loss(file + ": " + what + ": " + message); }

  template <typename T>
  Status read(T* out) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "bool is read as a byte");
    if (sizeof(T) > left()) return truncated(sizeof(T));
    std::memcpy(out, data + pos, sizeof(T));
    pos += sizeof(T);
    return Status::ok();
  }
  // A gguf string (u64 length, bytes): a view into the file.
  Status read_string(std::string_view* out) {
    uint64_t n = 0;
    TESSERA_RETURN_IF_ERROR(read(&n));
    if (n > left())
      return error("string of " + std::to_string(n) + " bytes at byte " + std::to_string(pos - 8) +
                   " is longer than the " + std::to_string(left()) + " bytes left in the file");
    *out = std::string_view(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
    return Status::ok();
  }
};

bool gguf_known_value_type(uint32_t type) { return type <= static_cast<uint32_t>(GgufValueType::kF64); }

// The fewest bytes one array item of `type` takes in the file.
uint64_t gguf_min_item_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    case GgufValueType::kString: return 8;      // the length
    case GgufValueType::kArray: return 4 + 8;   // element type and count
  }
  return 1;
}

template <typename Stored, typename Held>
Status gguf_read_scalar(GgufCursor& c, GgufValue* out) {
  Stored v{};
  TESSERA_RETURN_IF_ERROR(c.read(&v));
  out->value = static_cast<Held>(v);
  return Status::ok();
}

Status gguf_read_value(GgufCursor& c, GgufValueType type, int depth, GgufValue* out);

Status gguf_read_array(GgufCursor& c, int depth, GgufArray* out) {
  if (depth >= kGgufMaxArrayDepth)
    return c.error("arrays nested more than " + std::to_string(kGgufMaxArrayDepth) + " deep");
  uint32_t element_type = 0;
  uint64_t count = 0;
  TESSERA_RETURN_IF_ERROR(c.read(&element_type));
  if (!gguf_known_value_type(element_type))
    return c.error("array element type " + std::to_string(element_type) + ", which GGUF does not define");
  TESSERA_RETURN_IF_ERROR(c.read(&count));
  out->element_type = static_cast<GgufValueType>(element_type);
  const uint64_t min_bytes = gguf_min_item_bytes(out->element_type);
  if (count > c.left() / min_bytes)
    return c.error("array of " + std::to_string(count) + " " + gguf_value_type_name(out->element_type) +
                   " items at byte " + std::to_string(c.pos - 12) + " needs at least " + std::to_string(min_bytes) +
                   " bytes each, more than the " + std::to_string(c.left()) + " bytes left in the file");
  out->items.resize(static_cast<size_t>(count));
  for (GgufValue& item : out->items) TESSERA_RETURN_IF_ERROR(gguf_read_value(c, out->element_type, depth + 1, &item));
  return Status::ok();
}

// Integers are held widened by signedness, f32 as double (see GgufValue).
Status gguf_read_value(GgufCursor& c, GgufValueType type, int depth, GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufValueType::kU8: return gguf_read_scalar<uint8_t, uint64_t>(c, out);
    case GgufValueType::kI8: return gguf_read_scalar<int8_t, int64_t>(c, out);
    case GgufValueType::kU16: return gguf_read_scalar<uint16_t, uint64_t>(c, out);
    case GgufValueType::kI16: return gguf_read_scalar<int16_t, int64_t>(c, out);
    case GgufValueType::kU32: return gguf_read_scalar<uint32_t, uint64_t>(c, out);
    case GgufValueType::kI32: return gguf_read_scalar<int32_t, int64_t>(c, out);
    case GgufValueType::kU64: return gguf_read_scalar<uint64_t, uint64_t>(c, out);
    case GgufValueType::kI64: return gguf_read_scalar<int64_t, int64_t>(c, out);
    case GgufValueType::kF32: return gguf_read_scalar<float, double>(c, out);
    case GgufValueType::kF64: return gguf_read_scalar<double, double>(c, out);
    case GgufValueType::kBool: {
      uint8_t b = 0;  // any nonzero byte is true, as in llama.cpp
      TESSERA_RETURN_IF_ERROR(c.read(&b));
      out->value = b != 0;
      return Status::ok();
    }
    case GgufValueType::kString: {
      std::string_view s;
      TESSERA_RETURN_IF_ERROR(c.read_string(&s));
      out->value = std::string(s);
      return Status::ok();
    }
    case GgufValueType::kArray: {
      GgufArray array;
      TESSERA_RETURN_IF_ERROR(gguf_read_array(c, depth, &array));
      out->value = std::move(array);
      return Status::ok();
    }
  }
  return c.error("value type " + std::to_string(static_cast<uint32_t>(type)) + ", which GGUF does not define");
}

uint32_t gguf_byteswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

Status gguf_read_header(GgufCursor& c, uint32_t* version, uint64_t* tensor_count, uint64_t* kv_count) {
  uint32_t magic = 0;
  TESSERA_RETURN_IF_ERROR(c.read(&magic));
  if (std::memcmp(&magic, "GGUF", 4) != 0)
    return invalid_argument(c.file + ": not a GGUF file (it does not start with the bytes 'GGUF')");
  TESSERA_RETURN_IF_ERROR(c.read(version));
  if (*version != 2 && *version != 3) {
    const uint32_t swapped = gguf_byteswap32(*version);
    if (swapped == 2 || swapped == 3)
      return unimplemented(c.file + ": a big-endian GGUF file (version " + std::to_string(swapped) +
                           "); only little-endian files are supported");
    return unimplemented(c.file + ": GGUF version " + std::to_string(*version) +
                         " is not supported (only versions 2 and 3)");
  }
  TESSERA_RETURN_IF_ERROR(c.read(tensor_count));
  return c.read(kv_count);
}

Status gguf_read_metadata(GgufCursor& c, uint64_t count, GgufMetadata* out) {
  if (count > c.left() / kGgufMinKvBytes)
    return data_loss(c.file + ": the header claims " + std::to_string(count) + " metadata keys, more than the " +
                     std::to_string(c.left()) + " bytes after it can hold");
  out->reserve(static_cast<size_t>(count));
  std::unordered_set<std::string_view> seen;  // views into the file
  for (uint64_t i = 0; i < count; ++i) {
    const std::string where = "the metadata (key " + std::to_string(i + 1) + " of " + std::to_string(count);
    c.what = where + ")";
    std::string_view key;
    TESSERA_RETURN_IF_ERROR(c.read_string(&key));
    c.what = where + " " + gguf_quote(key) + ")";
    if (!seen.insert(key).second) return c.error("duplicate key " + gguf_quote(key));
    uint32_t type = 0;
    TESSERA_RETURN_IF_ERROR(c.read(&type));
    if (!gguf_known_value_type(type))
      return c.error("value type " + std::to_string(type) + ", which GGUF does not define");
    GgufValue value;
    TESSERA_RETURN_IF_ERROR(gguf_read_value(c, static_cast<GgufValueType>(type), 0, &value));
    out->emplace_back(std::string(key), std::move(value));
  }
  return Status::ok();
}

// general.alignment: a u32, a nonzero power of two; 32 when absent.
StatusOr<uint64_t> gguf_alignment(const GgufMetadata& metadata, const std::string& file) {
  for (const auto& [key, value] : metadata) {
    if (key != "general.alignment") continue;
    if (value.type != GgufValueType::kU32)
      return data_loss(file + ": general.alignment has type " + gguf_value_type_name(value.type) + ", not u32");
    const uint64_t alignment = std::get<uint64_t>(value.value);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      return data_loss(file + ": general.alignment is " + std::to_string(alignment) + ", not a power of two");
    return alignment;
  }
  return kGgufDefaultAlignment;
}

// One tensor info, as far as the bytes go: the name, the dimensions and the type.
Status gguf_read_tensor_info(GgufCursor& c, uint64_t index, uint64_t count, GgufTensor* t, uint64_t* offset) {
  const std::string where = "the tensor table (tensor " + std::to_string(index + 1) + " of " + std::to_string(count);
  c.what = where + ")";
  std::string_view name;
  TESSERA_RETURN_IF_ERROR(c.read_string(&name));
  t->name = std::string(name);
  c.what = where + " " + gguf_quote(name) + ")";
  uint32_t n_dims = 0;
  TESSERA_RETURN_IF_ERROR(c.read(&n_dims));
  if (n_dims == 0 || n_dims > kGgufMaxDims)
    return data_loss(c.file + ": tensor " + gguf_quote(name) + " has " + std::to_string(n_dims) +
                     " dimensions (GGUF allows 1 to 4)");
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t dim = 0;
    TESSERA_RETURN_IF_ERROR(c.read(&dim));
    if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return data_loss(c.file + ": tensor " + gguf_quote(name) + " has dimension " + std::to_string(d) + " of size " +
                       std::to_string(dim) + " (sizes must be positive)");
    t->dims.push_back(static_cast<int64_t>(dim));
  }
  TESSERA_RETURN_IF_ERROR(c.read(&t->type));
  return c.read(offset);
}

// The tensor's type must be known, its rows whole blocks and its size representable.
Status gguf_size_tensor(const std::string& file, GgufTensor* t) {
  const std::string subject = file + ": tensor " + gguf_quote(t->name);
  const GgmlTypeTraits* traits = ggml_type_traits(t->type);
  if (traits == nullptr)
    return unimplemented(subject + " has type " + std::to_string(t->type) + ", which ggml does not define " +
                         "(or this reader does not know)");
  if (t->dims[0] % traits->block_elems != 0)
    return data_loss(subject + " has dims " + gguf_dims_text(t->dims) + ": the first, " + std::to_string(t->dims[0]) +
                     ", is not a multiple of the " + traits->name + " block of " + std::to_string(traits->block_elems) +
                     " elements");
  int64_t numel = 1;
  for (int64_t dim : t->dims)
    if (__builtin_mul_overflow(numel, dim, &numel))
      return data_loss(subject + " has dims " + gguf_dims_text(t->dims) + ", whose element count overflows");
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel / traits->block_elems),
                             static_cast<uint64_t>(traits->block_bytes), &nbytes) ||
      nbytes > std::numeric_limits<size_t>::max())
    return data_loss(subject + " has dims " + gguf_dims_text(t->dims) + ", whose size in bytes overflows");
  t->nbytes = static_cast<size_t>(nbytes);
  return Status::ok();
}

Status gguf_read_tensor_table(GgufCursor& c, uint64_t count, std::vector<GgufTensor>* tensors,
                              std::vector<uint64_t>* offsets) {
  if (count > c.left() / kGgufMinTensorInfoBytes)
    return data_loss(c.file + ": the header claims " + std::to_string(count) + " tensors, more than the " +
                     std::to_string(c.left()) + " bytes after the metadata can hold");
  tensors->resize(static_cast<size_t>(count));
  offsets->resize(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    TESSERA_RETURN_IF_ERROR(gguf_read_tensor_info(c, i, count, &(*tensors)[i], &(*offsets)[i]));
    TESSERA_RETURN_IF_ERROR(gguf_size_tensor(c.file, &(*tensors)[i]));
  }
  std::unordered_set<std::string_view> seen;  // the vector no longer moves
  for (const GgufTensor& t : *tensors)
    if (!seen.insert(t.name).second) return data_loss(c.file + ": duplicate tensor name " + gguf_quote(t.name));
  return Status::ok();
}

// Points every tensor into the data section, which starts at `data_start`.
Status gguf_place_tensors(const uint8_t* data, size_t size, uint64_t data_start, uint64_t alignment,
                          const std::vector<uint64_t>& offsets, const std::string& file,
                          std::vector<GgufTensor>* tensors) {
  const uint64_t available = data_start <= size ? size - data_start : 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    GgufTensor& t = (*tensors)[i];
    const uint64_t offset = offsets[i];
    if (offset % alignment != 0)
      return data_loss(file + ": tensor " + gguf_quote(t.name) + " has offset " + std::to_string(offset) +
                       ", not a multiple of the alignment " + std::to_string(alignment));
    if (offset > available || t.nbytes > available - offset)
      return data_loss(file + ": tensor " + gguf_quote(t.name) + " (" + std::to_string(t.nbytes) +
                       " bytes at offset " + std::to_string(offset) + " of the data section at byte " +
                       std::to_string(data_start) + ") lies past the end of the file (" + std::to_string(size) +
                       " bytes)");
    t.data = data + data_start + offset;
    t.file = file;
  }
  return Status::ok();
}

struct GgufContents {
  uint32_t version = 0;
  uint64_t alignment = kGgufDefaultAlignment;
  GgufMetadata metadata;
  std::vector<GgufTensor> tensors;
};

StatusOr<GgufContents> gguf_read_contents(const uint8_t* data, size_t size, const std::string& file) {
  GgufCursor c{data, size, file};
  GgufContents out;
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  TESSERA_RETURN_IF_ERROR(gguf_read_header(c, &out.version, &tensor_count, &kv_count));
  TESSERA_RETURN_IF_ERROR(gguf_read_metadata(c, kv_count, &out.metadata));
  TESSERA_ASSIGN_OR_RETURN(out.alignment, gguf_alignment(out.metadata, file));
  std::vector<uint64_t> offsets;
  TESSERA_RETURN_IF_ERROR(gguf_read_tensor_table(c, tensor_count, &out.tensors, &offsets));
  // pos <= size and alignment <= 2^31: no overflow.
  const uint64_t data_start = (c.pos + out.alignment - 1) / out.alignment * out.alignment;
  TESSERA_RETURN_IF_ERROR(gguf_place_tensors(data, size, data_start, out.alignment, offsets, file, &out.tensors));
  return out;
}

}  // namespace

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // checked against overflow when read
  return n;
}

GgufFile::~GgufFile() = default;

StatusOr<std::unique_ptr<GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(GgufContents contents, gguf_read_contents(data, size, name));
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = name;
  file->version_ = contents.version;
  file->alignment_ = contents.alignment;
  file->metadata_ = std::move(contents.metadata);
  file->tensors_ = std::move(contents.tensors);
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, value] : metadata_)
    if (k == key) return &value;
  return nullptr;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  for (const GgufTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace tessera
