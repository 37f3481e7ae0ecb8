// dequantize_ggml: validation and dispatch, the float types and ggml's legacy 32-element
// blocks (q4_0, q4_1, q5_0, q5_1, q8_0). The K-quants are in ggml_dequant_kquants.cc.
#include "common/gguf/ggml_dequant.h"

#include <cstring>
#include <string>

#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "common/gguf/gguf_file.h"

namespace tessera {

namespace {

// One row per decodable type; `block_elems` is the type's own, so that a count that is not
// a whole number of blocks is refused before any byte is read.
struct GgmlDequantRow {
  GgmlType type;
  int64_t block_elems;
  void (*decode)(const uint8_t* src, int64_t blocks, float* dst);
};

void dequantize_f32_elems(const uint8_t* src, int64_t n, float* dst) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void dequantize_f16_elems(const uint8_t* src, int64_t n, float* dst) {
  convert_elements(src, DType::kF16, dst, DType::kF32, static_cast<size_t>(n));
}
void dequantize_bf16_elems(const uint8_t* src, int64_t n, float* dst) {
  convert_elements(src, DType::kBF16, dst, DType::kF32, static_cast<size_t>(n));
}

constexpr GgmlDequantRow kGgmlDequantRows[] = {
    {GgmlType::kF32, 1, dequantize_f32_elems},
    {GgmlType::kF16, 1, dequantize_f16_elems},
    {GgmlType::kBF16, 1, dequantize_bf16_elems},
    {GgmlType::kQ8_0, kGgmlQK, dequantize_q8_0_blocks},
    {GgmlType::kQ4_0, kGgmlQK, dequantize_q4_0_blocks},
    {GgmlType::kQ4_1, kGgmlQK, dequantize_q4_1_blocks},
    {GgmlType::kQ5_0, kGgmlQK, dequantize_q5_0_blocks},
    {GgmlType::kQ5_1, kGgmlQK, dequantize_q5_1_blocks},
    {GgmlType::kQ4_K, kGgmlQKK, dequantize_q4_k_blocks},
    {GgmlType::kQ5_K, kGgmlQKK, dequantize_q5_k_blocks},
    {GgmlType::kQ6_K, kGgmlQKK, dequantize_q6_k_blocks},
};

const GgmlDequantRow* find_ggml_dequant_row(uint32_t type) {
  for (const GgmlDequantRow& row : kGgmlDequantRows) {
    if (static_cast<uint32_t>(row.type) == type) return &row;
  }
  return nullptr;
}

// Bit 4 of element i of a q5_0 / q5_1 block.
int ggml_q5_high_bit(const uint8_t qh[4], int i) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));
  return static_cast<int>((bits >> i) & 1u) << 4;
}

}  // namespace

void dequantize_q4_0_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQK) {
    const auto block = load_ggml_block<BlockQ4_0>(src, b);
    const float d = f16_to_f32(block.d);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      dst[j] = static_cast<float>((block.qs[j] & 0x0f) - 8) * d;
      dst[j + kGgmlQK / 2] = static_cast<float>((block.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQK) {
    const auto block = load_ggml_block<BlockQ4_1>(src, b);
    const float d = f16_to_f32(block.d);
    const float m = f16_to_f32(block.m);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      dst[j] = static_cast<float>(block.qs[j] & 0x0f) * d + m;
      dst[j + kGgmlQK / 2] = static_cast<float>(block.qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQK) {
    const auto block = load_ggml_block<BlockQ5_0>(src, b);
    const float d = f16_to_f32(block.d);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      const int lo = (block.qs[j] & 0x0f) | ggml_q5_high_bit(block.qh, j);
      const int hi = (block.qs[j] >> 4) | ggml_q5_high_bit(block.qh, j + kGgmlQK / 2);
      dst[j] = static_cast<float>(lo - 16) * d;
      dst[j + kGgmlQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequantize_q5_1_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQK) {
    const auto block = load_ggml_block<BlockQ5_1>(src, b);
    const float d = f16_to_f32(block.d);
    const float m = f16_to_f32(block.m);
    for (int j = 0; j < kGgmlQK / 2; ++j) {
      const int lo = (block.qs[j] & 0x0f) | ggml_q5_high_bit(block.qh, j);
      const int hi = (block.qs[j] >> 4) | ggml_q5_high_bit(block.qh, j + kGgmlQK / 2);
      dst[j] = static_cast<float>(lo) * d + m;
      dst[j + kGgmlQK / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequantize_q8_0_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQK) {
    const auto block = load_ggml_block<BlockQ8_0>(src, b);
    const float d = f16_to_f32(block.d);
    for (int j = 0; j < kGgmlQK; ++j) dst[j] = static_cast<float>(block.qs[j]) * d;
  }
}

bool ggml_type_dequantizable(uint32_t type) { return find_ggml_dequant_row(type) != nullptr; }

Status dequantize_ggml(uint32_t type, const uint8_t* src, int64_t n, float* dst) {
  const GgmlDequantRow* row = find_ggml_dequant_row(type);
  if (row == nullptr) {
    return unimplemented("decoding ggml type " + ggml_type_name(type) +
                         " is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, "
                         "q5_K and q6_K are)");
  }
  if (n < 0 || n % row->block_elems != 0) {
    return invalid_argument("decoding " + std::to_string(n) + " elements of ggml type " +
                            ggml_type_name(type) + ": not a whole number of its " +
                            std::to_string(row->block_elems) + "-element blocks");
  }
  row->decode(src, n / row->block_elems, dst);
  return Status::ok();
}

}  // namespace tessera
