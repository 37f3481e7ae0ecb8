#pragma once
// The float tensors and their transforms tests/worker/gguf_from_hf.h converts with, as llama.cpp's
// convert_hf_to_gguf.py (d32676d77) transforms a Hugging Face checkpoint's: ggml's q8_0 blocks,
// and rows taken in another order (Llama's Q/K permutation, grouped QKVs regrouped) or
// transposed (GPT-2's Conv1D). Test-only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace tessera::testing {

// ggml's q8_0 of one row (a multiple of 32 elements): per block of 32, fp16 d = max|x| / 127
// and int8 round(x / d) (halves away from zero), as ggml-quants.c and gguf-py's quants.py.
inline std::string ggml_q8_0_encode(const float* x, int64_t n) {
  std::string out;
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float d = amax / 127.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    const uint16_t dh = f32_to_f16(d);
    out.append(reinterpret_cast<const char*>(&dh), 2);
    for (int64_t i = 0; i < 32; ++i) out.push_back(static_cast<char>(static_cast<int8_t>(std::round(x[b + i] * id))));
  }
  return out;
}

// What ggml_q8_0_encode's bytes decode to.
inline std::vector<float> ggml_q8_0_decode(const std::string& bytes) {
  std::vector<float> out;
  for (size_t b = 0; b + 34 <= bytes.size(); b += 34) {
    uint16_t dh;
    std::memcpy(&dh, bytes.data() + b, 2);
    const float d = f16_to_f32(dh);
    for (size_t i = 0; i < 32; ++i) out.push_back(d * static_cast<float>(static_cast<int8_t>(bytes[b + 2 + i])));
  }
  return out;
}

namespace gguf_from_hf_detail {


// A tensor in PyTorch terms: shape outermost first, row-major floats.
struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t rows() const { return shape.empty() ? 0 : static_cast<int64_t>(data.size()) / shape.back(); }
};

// Rows regrouped: out row r = in row order[r] (each row `width` floats).
inline HfTensor take_rows(const HfTensor& t, const std::vector<int64_t>& order, int64_t width) {
  HfTensor out{t.shape, std::vector<float>(t.data.size())};
  for (size_t r = 0; r < order.size(); ++r)
    std::memcpy(&out.data[r * width], &t.data[order[r] * width], static_cast<size_t>(width) * sizeof(float));
  return out;
}

// The width of one "row" of a weight or a bias: a bias's rows are single elements.
inline int64_t row_width(const HfTensor& t) { return t.shape.size() == 1 ? 1 : t.shape.back(); }

// LlamaModel.permute: per head of D rows, GGUF row 2i + j is Hugging Face row j * D/2 + i.
inline HfTensor llama_permute(const HfTensor& t, int64_t heads) {
  const int64_t rows = t.shape[0], d = rows / heads, half = d / 2;
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) order[h * d + 2 * i + j] = h * d + j * half + i;
  return take_rows(t, order, row_width(t));
}

// Hugging Face QKV rows in KV groups of [`per_group` q heads, k head, v head] (BLOOM and
// GPT-NeoX: one q head per group; Falcon: heads / kv_heads) to GGUF's [all q; all k; all v].
inline HfTensor qkv_groups_to_blocks(const HfTensor& t, int64_t kv_heads, int64_t per_group, int64_t head_dim) {
  std::vector<int64_t> order;
  auto group_head = [&](int64_t g, int64_t slot) {
    for (int64_t i = 0; i < head_dim; ++i) order.push_back((g * (per_group + 2) + slot) * head_dim + i);
  };
  for (int64_t g = 0; g < kv_heads; ++g)
    for (int64_t q = 0; q < per_group; ++q) group_head(g, q);
  for (int64_t g = 0; g < kv_heads; ++g) group_head(g, per_group);
  for (int64_t g = 0; g < kv_heads; ++g) group_head(g, per_group + 1);
  return take_rows(t, order, row_width(t));
}

inline HfTensor transpose2d(const HfTensor& t) {
  const int64_t r = t.shape[0], c = t.shape[1];
  HfTensor out{{c, r}, std::vector<float>(t.data.size())};
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out.data[j * r + i] = t.data[i * c + j];
  return out;
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace gguf_from_hf_detail
}  // namespace tessera::testing
