#pragma once
// GGUF files (llama.cpp's model format, versions 2 and 3): a header, typed metadata
// (key -> value), a tensor table and the tensor data, every tensor at a multiple of the
// file's alignment from the start of the data section. GgufFile maps the file read-only and
// validates all of it before anything is used: a hostile or truncated file is one error line
// naming the file and what is wrong, never a read past the mapping.
//
// A model split by llama.cpp's gguf-split (NAME-00001-of-00003.gguf ...) opens from its first
// part: the other parts are found by name, their `split.no` checked, their tensors joined
// into one table; the metadata is the first part's.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"

namespace tessera {

class MappedFile;

// ggml's tensor types, by the ids GGUF files store. Ids 4, 5 and 31-33, 36-38 were used by
// ggml once and are refused as unknown.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22,
  kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30,
  kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};

// How a type lays out a row: `block_elems` consecutive elements share one block of
// `block_bytes` bytes (1 and the element size for the plain types).
struct GgmlTypeTraits {
  const char* name;  // as llama.cpp prints it: "f32", "q4_0", "q4_K", "iq2_xxs", ...
  int64_t block_elems;
  int64_t block_bytes;
};
// nullptr for an id that is not a GgmlType above.
const GgmlTypeTraits* ggml_type_traits(uint32_t type);
// "q4_K", or "type 77" for an unknown id.
std::string ggml_type_name(uint32_t type);

enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);  // "u32", "string", "array", ...

struct GgufValue;
struct GgufArray {
  GgufValueType element_type = GgufValueType::kU8;
  std::vector<GgufValue> items;  // arrays may nest (an array of arrays)
};

// One metadata value. Integers of every width are held as int64_t or uint64_t (by
// signedness), f32/f64 as double; `type` keeps what the file stored.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;
};

// One entry of the tensor table. `dims` are in the file's order: dims[0] is the innermost
// (contiguous) one, so a Hugging Face [out, in] matrix is stored as dims {in, out}.
struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;
  uint32_t type = 0;           // a GgmlType id; validated known
  const uint8_t* data = nullptr;  // inside the read-only mapping of `file`
  size_t nbytes = 0;           // rows * (dims[0] / block_elems) * block_bytes
  std::string file;            // the part that holds it

  int64_t numel() const;
};

// Whether `path` names a GGUF file: not a folder, and its name ends in .gguf (any case).
bool is_gguf_path(const std::string& path);

class GgufFile {
 public:
  // Maps and validates `path` (and the other parts of a split model). Errors name the file
  // and the problem: not found, not a GGUF file (bad magic), unsupported version, truncated
  // (what was being read, at which byte), a string or array longer than the file, an
  // unknown value or tensor type (naming the key or tensor), a tensor whose offset is not a
  // multiple of the alignment, whose data lies past the end of the file, whose first
  // dimension is not a whole number of blocks, or whose element count overflows; a
  // duplicate key or tensor name; a missing or inconsistent split part.
  static StatusOr<std::unique_ptr<GgufFile>> open(const std::string& path);
  // The same checks on bytes in memory (tests, the fuzzer); `name` stands for the file in
  // errors. The bytes must outlive the GgufFile. Split models are not followed.
  static StatusOr<std::unique_ptr<GgufFile>> parse(const uint8_t* data, size_t size, const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }  // general.alignment, 32 by default

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed reads. Absent keys are NotFound and a value of another type InvalidArgument, both
  // naming the file and the key and (for the latter) the stored type. Integer reads accept
  // every integer width and refuse values the result cannot hold (negative for get_uint);
  // get_float accepts f32 and f64.
  StatusOr<uint64_t> get_uint(std::string_view key) const;
  StatusOr<int64_t> get_int(std::string_view key) const;
  StatusOr<double> get_float(std::string_view key) const;
  StatusOr<bool> get_bool(std::string_view key) const;
  StatusOr<std::string> get_string(std::string_view key) const;
  StatusOr<std::vector<std::string>> get_string_array(std::string_view key) const;
  StatusOr<std::vector<float>> get_float_array(std::string_view key) const;   // f32/f64 items
  StatusOr<std::vector<int64_t>> get_int_array(std::string_view key) const;   // any integer items

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::vector<std::unique_ptr<MappedFile>> parts_;  // empty for parse()
};

}  // namespace tessera
