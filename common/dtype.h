#pragma once
// Element types and the scalar conversions between them. Weights may be stored as
// f32, f16 or bf16; activations are computed in f32 on the CPU.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace tessera {

// kI8 holds int8 weight-only quantized linear weights (docs/quantization.md); no checkpoint
// is read as int8: the loader makes them from f32/f16/bf16.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "float16", ...
// Accepts the spellings users and file formats use: float32/f32/fp32/F32, float16/f16/fp16/half/F16,
// bfloat16/bf16/BF16, int32/I32, int64/I64, uint8/U8.
std::optional<DType> parse_dtype(std::string_view name);
// Only the weight/activation storage types (float32, float16, bfloat16).
std::optional<DType> parse_float_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even; overflow to infinity; NaN preserved.
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 ... computed for 24-bit mantissa
    uint32_t result = mant >> (shift - 0);
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = ((abs >> 13) - (112u << 10));
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

// Converts `n` elements between storage types (any of f32/f16/bf16).
void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace tessera
