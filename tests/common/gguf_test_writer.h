#pragma once
// Writes GGUF files byte by byte for tests: header, metadata of any value type, tensor infos
// and data laid out as llama.cpp lays them out. The fields are public so that a test can break
// any of them.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"

namespace tessera::testing {

template <typename T>
inline std::string gguf_le(T v) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

inline std::string gguf_str(const std::string& s) { return gguf_le<uint64_t>(s.size()) + s; }

// Array bytes: element type, count, then the items as given.
inline std::string gguf_array(GgufValueType element, uint64_t count, const std::string& items) {
  return gguf_le(static_cast<uint32_t>(element)) + gguf_le(count) + items;
}

// GGUF bytes laid out as llama.cpp writes them: header, metadata, tensor infos, padding to the
// alignment, then each tensor's data at the next multiple of the alignment (the last ending
// the file).
struct GgufTestWriter {
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type = 0;
    std::optional<uint64_t> offset;  // what the info says; the data goes where it belongs
    std::optional<std::string> data;  // the tensor's bytes; absent: data_byte() filler
  };
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint64_t alignment = 32;  // for the layout; a general.alignment key is added separately
  std::optional<uint64_t> kv_count;
  std::optional<uint64_t> tensor_count;
  std::vector<std::string> kvs;
  std::vector<Tensor> tensors;

  void kv(const std::string& key, GgufValueType type, const std::string& value) {
    kvs.push_back(gguf_str(key) + gguf_le(static_cast<uint32_t>(type)) + value);
  }
  void kv_u32(const std::string& key, uint32_t v) { kv(key, GgufValueType::kU32, gguf_le(v)); }
  void kv_string(const std::string& key, const std::string& v) { kv(key, GgufValueType::kString, gguf_str(v)); }
  void kv_f32(const std::string& key, float v) { kv(key, GgufValueType::kF32, gguf_le(v)); }
  void kv_bool(const std::string& key, bool v) { kv(key, GgufValueType::kBool, gguf_le<uint8_t>(v ? 1 : 0)); }
  void kv_strings(const std::string& key, const std::vector<std::string>& v) {
    std::string items;
    for (const std::string& s : v) items += gguf_str(s);
    kv(key, GgufValueType::kArray, gguf_array(GgufValueType::kString, v.size(), items));
  }
  void kv_f32s(const std::string& key, const std::vector<float>& v) {
    std::string items;
    for (float f : v) items += gguf_le(f);
    kv(key, GgufValueType::kArray, gguf_array(GgufValueType::kF32, v.size(), items));
  }
  void kv_i32s(const std::string& key, const std::vector<int32_t>& v) {
    std::string items;
    for (int32_t i : v) items += gguf_le(i);
    kv(key, GgufValueType::kArray, gguf_array(GgufValueType::kI32, v.size(), items));
  }
  // A tensor with filler bytes (data_byte), or with `data` (its size must match the type).
  void tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
              std::optional<std::string> data = std::nullopt) {
    tensors.push_back({name, std::move(dims), static_cast<uint32_t>(type), std::nullopt, std::move(data)});
  }

  static uint64_t nbytes(const Tensor& t) {
    const GgmlTypeTraits* traits = ggml_type_traits(t.type);
    if (traits == nullptr || t.dims.empty()) return 4;
    uint64_t n = 1;
    for (uint64_t d : t.dims) n *= d;
    return n / traits->block_elems * traits->block_bytes;
  }
  uint64_t pad(uint64_t n) const { return (n + alignment - 1) / alignment * alignment; }
  // Where each tensor's data lies, from the start of the data section.
  std::vector<uint64_t> offsets() const {
    std::vector<uint64_t> out;
    uint64_t at = 0;
    for (const Tensor& t : tensors) {
      out.push_back(at);
      at = pad(at + nbytes(t));
    }
    return out;
  }
  // Tensor i's byte j, so a test can check that a tensor points at its own data.
  static uint8_t data_byte(size_t i, uint64_t j) { return static_cast<uint8_t>(17 * i + j % 251 + 1); }

  std::string build() const {
    std::string out = magic + gguf_le(version) + gguf_le<uint64_t>(tensor_count.value_or(tensors.size())) +
                      gguf_le<uint64_t>(kv_count.value_or(kvs.size()));
    for (const std::string& kv : kvs) out += kv;
    const std::vector<uint64_t> at = offsets();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      out += gguf_str(t.name) + gguf_le(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out += gguf_le(d);
      out += gguf_le(t.type) + gguf_le(t.offset.value_or(at[i]));
    }
    if (tensors.empty()) return out;
    const size_t data_start = pad(out.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      out.resize(data_start + at[i], '\0');
      if (tensors[i].data) {
        out += *tensors[i].data;
        continue;
      }
      for (uint64_t j = 0; j < nbytes(tensors[i]); ++j) out.push_back(static_cast<char>(data_byte(i, j)));
    }
    return out;
  }
};

}  // namespace tessera::testing
