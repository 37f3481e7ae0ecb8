#pragma once
// One element of a row stored in ggml's quantized blocks (the layouts of
// ggml_dequant_blocks.h), decoded on its own: what looking up a few rows of a table kept as
// blocks needs (Backend::embedding_ggml, an untied GGUF embedding), on every backend. The
// arithmetic is dequantize_ggml's, in its order, so a row decoded element by element equals
// the row decoded whole. Plain C++17 on bytes: nvcc includes it.
#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_GGML_HD __host__ __device__
#else
#define TESSERA_GGML_HD
#endif

namespace tessera::ggml_element {

// ggml type ids (common/gguf/gguf_file.h's GgmlType) of the block types decoded here.
inline constexpr uint32_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;

TESSERA_GGML_HD inline bool decodes(uint32_t type) {
  return type == kQ4_0 || type == kQ4_1 || type == kQ5_0 || type == kQ5_1 || type == kQ8_0 || type == kQ4_K ||
         type == kQ5_K || type == kQ6_K;
}
// Elements per block: 32 for the legacy types, 256 for the K-quants.
TESSERA_GGML_HD inline int64_t block_elems(uint32_t type) { return type >= kQ4_K ? 256 : 32; }
TESSERA_GGML_HD inline int64_t block_bytes(uint32_t type) {
  switch (type) {
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ5_0: return 22;
    case kQ5_1: return 24;
    case kQ8_0: return 34;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    default: return 210;  // kQ6_K
  }
}

TESSERA_GGML_HD inline uint32_t u16_at(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }

// An IEEE half to float, exactly (common/dtype.h's f16_to_f32, without memcpy).
TESSERA_GGML_HD inline float half_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0 && mant == 0) {
    bits = sign;
  } else if (exp == 0) {  // subnormal: normalised
    exp = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  union {
    uint32_t u;
    float f;
  } v{bits};
  return v.f;
}

// The 4 low bits of element j (< 32) of a legacy block's 16 bytes of nibbles: byte j holds
// element j in its low nibble and element j + 16 in its high one.
TESSERA_GGML_HD inline int legacy_nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }

// Bit 4 of element j of a q5_0 / q5_1 block: bit j of qh read as a little-endian uint32.
TESSERA_GGML_HD inline int q5_high_bit(const uint8_t* qh, int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

// The 6-bit scale (min: false) or min (true) of sub-block s of a q4_K / q5_K super-block
// (ggml_dequant_blocks.h's ggml_k_scale_min).
TESSERA_GGML_HD inline int k_scale_min(const uint8_t* packed, int s, bool min) {
  if (s < 4) return packed[s + (min ? 4 : 0)] & 0x3f;
  return min ? (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4) : (packed[s + 4] & 0x0f) | ((packed[s - 4] >> 6) << 4);
}

// Element i (< block_elems(type)) of the block at `b`.
TESSERA_GGML_HD inline float block_element(uint32_t type, const uint8_t* b, int i) {
  switch (type) {
    case kQ4_0:
      return static_cast<float>(legacy_nibble(b + 2, i) - 8) * half_to_float(u16_at(b));
    case kQ4_1:
      return static_cast<float>(legacy_nibble(b + 4, i)) * half_to_float(u16_at(b)) + half_to_float(u16_at(b + 2));
    case kQ5_0:
      return static_cast<float>((legacy_nibble(b + 6, i) | q5_high_bit(b + 2, i)) - 16) * half_to_float(u16_at(b));
    case kQ5_1:
      return static_cast<float>(legacy_nibble(b + 8, i) | q5_high_bit(b + 4, i)) * half_to_float(u16_at(b)) +
             half_to_float(u16_at(b + 2));
    case kQ8_0:
      return static_cast<float>(static_cast<int8_t>(b[2 + i])) * half_to_float(u16_at(b));
    case kQ4_K:
    case kQ5_K: {
      // d, dmin, 12 bytes of scales, (q5_K: 32 bytes of top bits,) 128 bytes of nibbles in 4
      // runs of 32: run r holds sub-block 2r in its low nibbles and 2r + 1 in its high ones.
      const int s = i / 32, l = i % 32;
      const uint8_t* qs = b + (type == kQ5_K ? 48 : 16);
      int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f;
      if (type == kQ5_K) q |= ((b[16 + l] >> s) & 1) << 4;
      const float scale = half_to_float(u16_at(b)) * static_cast<float>(k_scale_min(b + 4, s, false));
      const float min = half_to_float(u16_at(b + 2)) * static_cast<float>(k_scale_min(b + 4, s, true));
      return scale * static_cast<float>(q) - min;
    }
    default: {  // kQ6_K: ql[128], qh[64], scales[16] (int8), d
      const int half = i / 128, k = (i % 128) / 32, l = i % 32;
      const int low = (b[64 * half + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
      const int high = (b[128 + 32 * half + l] >> (2 * k)) & 0x03;
      const float d = half_to_float(u16_at(b + 208));
      return d * static_cast<float>(static_cast<int8_t>(b[192 + i / 16])) * static_cast<float>((low | (high << 4)) - 32);
    }
  }
}

// Element i of a row stored as blocks of `type`.
TESSERA_GGML_HD inline float row_element(uint32_t type, const uint8_t* row, int64_t i) {
  const int64_t n = block_elems(type);
  return block_element(type, row + i / n * block_bytes(type), static_cast<int>(i % n));
}

}  // namespace tessera::ggml_element
