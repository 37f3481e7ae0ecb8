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

// One loop per pair of types, the conversion inlined: the compiler vectorizes it (a GGUF
// file's embedding, decoded to bf16 at load, is 65M elements for a ~1.1B Llama; a switch on
// the type per element kept that loop scalar, ~8% of a q4_K_M start-up's CPU time).
template <typename Src, typename Dst, typename Convert>
void convert_loop(const void* src, void* dst, size_t n, Convert convert) {
  auto* d = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    const Dst v = convert(load_element<Src>(src, i));
    std::memcpy(d + i * sizeof(Dst), &v, sizeof(Dst));
  }
}
}  // namespace

void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  const auto f16_of_f32 = [](float f) { return f32_to_f16(f); };
  const auto bf16_of_f32 = [](float f) { return f32_to_bf16(f); };
  const auto f16_of_bf16 = [](uint16_t h) { return f32_to_f16(bf16_to_f32(h)); };
  const auto bf16_of_f16 = [](uint16_t h) { return f32_to_bf16(f16_to_f32(h)); };
  switch (dst_type) {
    case DType::kF32:
      if (src_type == DType::kF16) return convert_loop<uint16_t, float>(src, dst, n, f16_to_f32);
      if (src_type == DType::kBF16) return convert_loop<uint16_t, float>(src, dst, n, bf16_to_f32);
      break;
    case DType::kF16:
      if (src_type == DType::kF32) return convert_loop<float, uint16_t>(src, dst, n, f16_of_f32);
      if (src_type == DType::kBF16) return convert_loop<uint16_t, uint16_t>(src, dst, n, f16_of_bf16);
      break;
    case DType::kBF16:
      if (src_type == DType::kF32) return convert_loop<float, uint16_t>(src, dst, n, bf16_of_f32);
      if (src_type == DType::kF16) return convert_loop<uint16_t, uint16_t>(src, dst, n, bf16_of_f16);
      break;
    default: TESSERA_CHECK(false) << "cannot convert to " << dtype_name(dst_type);
  }
  TESSERA_CHECK(false) << "not a float type: " << dtype_name(src_type);
}

}  // namespace tessera
