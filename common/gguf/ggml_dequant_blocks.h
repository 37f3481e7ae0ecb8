#pragma once
// ggml's quantized blocks, byte for byte as llama.cpp writes them into GGUF files
// (ggml-common.h), and the scalar decoders of whole blocks behind dequantize_ggml. Kept
// apart from ggml_dequant.h so that faster kernels share the layouts and test against these
// decoders block by block.
//
// Every scale `d`, `m`, `dmin` is an IEEE half, little-endian. The legacy types pack 32
// elements per block; the K-quants 256 per super-block, split into sub-blocks that each
// carry their own small integer scale, itself scaled by the super-block's half.
#include <bit>
#include <cstdint>
#include <cstring>

namespace tessera {

static_assert(std::endian::native == std::endian::little,
              "ggml blocks are little-endian and are read by memcpy into these structs");

inline constexpr int kGgmlQK = 32;    // elements per block of q4_0, q4_1, q5_0, q5_1, q8_0
inline constexpr int kGgmlQKK = 256;  // elements per super-block of q4_K, q5_K, q6_K

#pragma pack(push, 1)

// x[i] = (q[i] - 8) * d. Byte j holds element j in its low nibble and element j + 16 in its
// high nibble (not 2j and 2j + 1).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kGgmlQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// x[i] = q[i] * d + m, nibbles as in q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kGgmlQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// x[i] = (q[i] - 16) * d with 5-bit q: the low 4 bits as in q4_0, bit 4 of element i is
// bit i of qh read as one little-endian uint32.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kGgmlQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// x[i] = q[i] * d + m, 5-bit q as in q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kGgmlQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// x[i] = qs[i] * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kGgmlQK];
};
static_assert(sizeof(BlockQ8_0) == 34);

// 8 sub-blocks of 32: x = q * (d * scale_s) - dmin * min_s, with 6-bit scale_s and min_s
// packed into 12 bytes (ggml_k_scale_min in ggml_dequant_kquants.cc). The 128 bytes are 4
// runs of 32: run r holds sub-block 2r in its low nibbles and sub-block 2r + 1 in its high.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kGgmlQKK / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As q4_K with 5-bit q: bit 4 of element l of sub-block s (l < 32) is bit s of qh[l].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kGgmlQKK / 8];
  uint8_t qs[kGgmlQKK / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 groups of 16: x = d * scales[g] * (q - 32) with 6-bit q and signed 8-bit scales, in
// group order. Each half of 128 elements uses 64 bytes of ql and 32 of qh: element
// 32k + l of the half (k < 4, l < 32) takes its low 4 bits from ql[l + 32 * (k % 2)]
// (low nibble for k < 2, high for k >= 2) and its top 2 bits from bits 2k, 2k + 1 of qh[l].
struct BlockQ6_K {
  uint8_t ql[kGgmlQKK / 2];
  uint8_t qh[kGgmlQKK / 4];
  int8_t scales[kGgmlQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

#pragma pack(pop)

// Block `b` of `src` as its struct: blocks lie back to back at any alignment (18 bytes
// apart for q4_0), so they are copied out rather than cast in place.
template <typename Block>
Block load_ggml_block(const uint8_t* src, int64_t b) {
  Block block;
  std::memcpy(&block, src + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return block;
}

// The 6-bit scale and min of sub-block `s` (0..7) of a q4_K / q5_K super-block. Sub-blocks
// 0..3 keep theirs whole in the low 6 bits of bytes s (scale) and s + 4 (min). Sub-blocks
// 4..7 keep their low 4 bits in byte s + 4 (scale in the low nibble, min in the high) and
// their top 2 bits in the otherwise unused top bits of bytes s - 4 (scale) and s (min).
struct GgmlKScaleMin {
  int scale;
  int min;
};
GgmlKScaleMin ggml_k_scale_min(const uint8_t packed[12], int s);

// The 256 unsigned q values (0..63, the element is d * scales[e / 16] * (q - 32)) of a q6_K
// super-block, in element order.
void ggml_q6_k_values(const BlockQ6_K& block, uint8_t q[kGgmlQKK]);

// Decoders of `blocks` whole blocks from `src` (any alignment) into blocks * block-elements
// floats. No checks: dequantize_ggml validates and dispatches.
void dequantize_q4_0_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q4_1_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q5_0_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q5_1_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q8_0_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q4_k_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q5_k_blocks(const uint8_t* src, int64_t blocks, float* dst);
void dequantize_q6_k_blocks(const uint8_t* src, int64_t blocks, float* dst);

}  // namespace tessera
