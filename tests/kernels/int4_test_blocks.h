#pragma once
// Random ggml blocks of the type each low-bit panel scheme (kernels/int4_layout.h) holds, for
// the CPU and CUDA op tests of linear_int4.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "common/gguf/gguf_file.h"
#include "common/tensor.h"
#include "kernels/int4_layout.h"

namespace tessera {

// The ggml block type each scheme holds: its id, bytes and elements per block.
struct BlockType {
  GgmlType type;
  int64_t bytes, elems;
};
inline BlockType block_type_of(Int4Scheme scheme) {
  switch (scheme) {
    case Int4Scheme::kSymmetric:
      return {GgmlType::kQ4_0, sizeof(BlockQ4_0), kGgmlQK};
    case Int4Scheme::kSymmetric5:
      return {GgmlType::kQ5_0, sizeof(BlockQ5_0), kGgmlQK};
    case Int4Scheme::kAsymmetric:
      return {GgmlType::kQ4_1, sizeof(BlockQ4_1), kGgmlQK};
    case Int4Scheme::kAsymmetric5:
      return {GgmlType::kQ5_1, sizeof(BlockQ5_1), kGgmlQK};
    case Int4Scheme::kSuperBlock:
      return {GgmlType::kQ4_K, sizeof(BlockQ4_K), kGgmlQKK};
    case Int4Scheme::kSuperBlock5:
      return {GgmlType::kQ5_K, sizeof(BlockQ5_K), kGgmlQKK};
    case Int4Scheme::kSixBit:
      break;
  }
  return {GgmlType::kQ6_K, sizeof(BlockQ6_K), kGgmlQKK};
}

// N rows of random blocks of the type `scheme` holds: every byte random, then the f16 fields
// (leading every block but q6_K's, whose d ends it) set to finite values of both signs and widely different sizes
// (and some zero); a q4_0 block gets a q of 0 somewhere, as llama.cpp's quantizer always
// makes (its largest value).
inline std::vector<uint8_t> random_block_rows(std::mt19937& rng, Int4Scheme scheme, int64_t N, int64_t K) {
  const BlockType bt = block_type_of(scheme);
  std::vector<uint8_t> rows(static_cast<size_t>(N * (K / bt.elems) * bt.bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& v : rows) v = static_cast<uint8_t>(byte(rng));
  // q4_K / q5_K: d and dmin; q4_1 / q5_1: d and m; the others: d alone.
  const bool two_halves = scheme != Int4Scheme::kSymmetric && scheme != Int4Scheme::kSymmetric5 &&
                          scheme != Int4Scheme::kSixBit;
  const float size = scheme == Int4Scheme::kSixBit ? 0.0005f : int4_super_block(scheme) ? 0.004f : 0.05f;
  std::uniform_real_distribution<float> scale(-size, size);
  for (int64_t b = 0; b < N * (K / bt.elems); ++b) {
    uint8_t* block = rows.data() + b * bt.bytes;
    for (int h = 0; h < (two_halves ? 2 : 1); ++h) {
      float v = b % 7 == 3 ? 0.0f : scale(rng) * (b % 5 == 0 ? 10.0f : 1.0f);
      if (int4_super_block(scheme)) v = std::fabs(v);  // q4_K's d and dmin are never negative
      const uint16_t f = f32_to_f16(v);
      std::memcpy(block + (scheme == Int4Scheme::kSixBit ? offsetof(BlockQ6_K, d) : 2 * h), &f, sizeof(f));
    }
    if (scheme == Int4Scheme::kSymmetric) {
      const int at = byte(rng) % 32;
      block[2 + at % 16] &= at < 16 ? 0xf0 : 0x0f;
    }
  }
  return rows;
}

inline constexpr Int4Scheme kAllSchemes[] = {Int4Scheme::kSymmetric,   Int4Scheme::kSymmetric5,  Int4Scheme::kAsymmetric,
                                      Int4Scheme::kAsymmetric5, Int4Scheme::kSuperBlock,  Int4Scheme::kSuperBlock5,
                                      Int4Scheme::kSixBit};

// V rows of H elements in random blocks of `type` (q8_0 too), as a u8 tensor [V, row bytes]:
// an embedding table kept as blocks.
inline Tensor random_ggml_table(GgmlType type, int64_t V, int64_t H, std::mt19937& rng) {
  std::vector<uint8_t> rows;
  if (type == GgmlType::kQ8_0) {
    rows.resize(static_cast<size_t>(V * H / kGgmlQK * sizeof(BlockQ8_0)));
    for (uint8_t& b : rows) b = static_cast<uint8_t>(rng());
    for (size_t at = 0; at < rows.size(); at += sizeof(BlockQ8_0)) {
      const uint16_t d = f32_to_f16(0.01f * static_cast<float>(rng() % 100 + 1));
      std::memcpy(&rows[at], &d, 2);
    }
  } else {
    for (const Int4Scheme s : kAllSchemes) {
      if (block_type_of(s).type == type) rows = random_block_rows(rng, s, V, H);
    }
  }
  Tensor t = Tensor::zeros({V, static_cast<int64_t>(rows.size()) / V}, DType::kU8);
  std::memcpy(t.data<uint8_t>(), rows.data(), rows.size());
  return t;
}

}  // namespace tessera
