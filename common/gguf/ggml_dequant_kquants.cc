// ggml's K-quants (q4_K, q5_K, q6_K): 256-element super-blocks whose sub-blocks carry
// 6-bit (q4_K, q5_K) or 8-bit (q6_K) scales of their own. Layouts in ggml_dequant_blocks.h.
#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"

namespace tessera {

GgmlKScaleMin ggml_k_scale_min(const uint8_t packed[12], int s) {
  if (s < 4) return {packed[s] & 0x3f, packed[s + 4] & 0x3f};
  return {(packed[s + 4] & 0x0f) | ((packed[s - 4] >> 6) << 4), (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4)};
}

void ggml_q6_k_values(const BlockQ6_K& block, uint8_t q[kGgmlQKK]) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = block.ql + 64 * half;
    const uint8_t* qh = block.qh + 32 * half;
    // Element 32k + l of this half: low 4 bits from ql[l] (k = 0, 2) or ql[l + 32] (k = 1, 3),
    // low nibble for k < 2 and high for k >= 2; top 2 bits from bits 2k, 2k + 1 of qh[l].
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
        const int high = (qh[l] >> (2 * k)) & 0x03;
        q[128 * half + 32 * k + l] = static_cast<uint8_t>(low | (high << 4));
      }
    }
  }
}

namespace {

// Elements 64r .. 64r + 63 of a q4_K / q5_K super-block: sub-blocks 2r and 2r + 1, from the
// low and the high nibbles of the same 32 bytes `qs`. `qh` (q5_K only, else nullptr) adds
// bit 4 of element l of sub-block s from bit s of qh[l].
void ggml_k_decode_pair(const uint8_t* scales, float d, float dmin, int r, const uint8_t* qs,
                        const uint8_t* qh, float* dst) {
  for (int half = 0; half < 2; ++half) {
    const int s = 2 * r + half;
    const GgmlKScaleMin sm = ggml_k_scale_min(scales, s);
    // The order of llama.cpp's reference (d * scale once, then q * that - dmin * min), so
    // that kernels tested against this decoder can be held to its rounding.
    const float scale = d * static_cast<float>(sm.scale);
    const float min = dmin * static_cast<float>(sm.min);
    const int shift = 4 * half;
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> shift) & 0x0f;
      if (qh != nullptr) q |= ((qh[l] >> s) & 1) << 4;
      dst[32 * half + l] = scale * static_cast<float>(q) - min;
    }
  }
}

}  // namespace

void dequantize_q4_k_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQKK) {
    const auto block = load_ggml_block<BlockQ4_K>(src, b);
    const float d = f16_to_f32(block.d);
    const float dmin = f16_to_f32(block.dmin);
    for (int r = 0; r < 4; ++r) {
      ggml_k_decode_pair(block.scales, d, dmin, r, block.qs + 32 * r, nullptr, dst + 64 * r);
    }
  }
}

void dequantize_q5_k_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQKK) {
    const auto block = load_ggml_block<BlockQ5_K>(src, b);
    const float d = f16_to_f32(block.d);
    const float dmin = f16_to_f32(block.dmin);
    for (int r = 0; r < 4; ++r) {
      ggml_k_decode_pair(block.scales, d, dmin, r, block.qs + 32 * r, block.qh, dst + 64 * r);
    }
  }
}

void dequantize_q6_k_blocks(const uint8_t* src, int64_t blocks, float* dst) {
  uint8_t q[kGgmlQKK];
  for (int64_t b = 0; b < blocks; ++b, dst += kGgmlQKK) {
    const auto block = load_ggml_block<BlockQ6_K>(src, b);
    const float d = f16_to_f32(block.d);
    ggml_q6_k_values(block, q);
    for (int e = 0; e < kGgmlQKK; ++e) {
      dst[e] = d * static_cast<float>(block.scales[e / 16]) * static_cast<float>(int{q[e]} - 32);
    }
  }
}

}  // namespace tessera
