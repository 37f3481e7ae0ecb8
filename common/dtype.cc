#include "common/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/check.h"

namespace tessera {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kI8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    case DType::kI8: return "int8";
  }
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "float32" || s == "f32" || s == "fp32" || s == "float") return DType::kF32;
  if (s == "float16" || s == "f16" || s == "fp16" || s == "half") return DType::kF16;
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "int32" || s == "i32") return DType::kI32;
  if (s == "int64" || s == "i64") return DType::kI64;
  if (s == "uint8" || s == "u8") return DType::kU8;
  if (s == "int8" || s == "i8") return DType::kI8;
  return std::nullopt;
}

std::optional<DType> parse_float_dtype(std::string_view name) {
  auto t = parse_dtype(name);
  if (t && (*t == DType::kF32 || *t == DType::kF16 || *t == DType::kBF16)) return t;
  return std::nullopt;
}

namespace {
// Element i of `src` by memcpy: the source may be unaligned (a legacy PyTorch checkpoint
// packs its storages with no padding), and the compiler turns the copy into one load.
template <typename T>
inline T load_element(const void* src, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(src) + i * sizeof(T), sizeof(T));
  return v;
}

inline float load_as_f32(const void* src, DType t, size_t i) {
  switch (t) {
    case DType::kF32: return load_element<float>(src, i);
    case DType::kF16: return f16_to_f32(load_element<uint16_t>(src, i));
    case DType::kBF16: return bf16_to_f32(load_element<uint16_t>(src, i));
    default: TESSERA_CHECK(false) << "not a float type: " << dtype_name(t);
  }
  return 0.f;
}
}  // namespace

void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  switch (dst_type) {
    case DType::kF32: {
      auto* d = static_cast<float*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = load_as_f32(src, src_type, i);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(load_as_f32(src, src_type, i));
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(load_as_f32(src, src_type, i));
      return;
    }
    default: TESSERA_CHECK(false) << "cannot convert to " << dtype_name(dst_type);
  }
}

}  // namespace tessera
