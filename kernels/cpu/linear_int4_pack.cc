// The low-bit panels of linear_int4.h: packing from ggml blocks and from floats, and the float
// matrix they stand for. Load-time code: clear rather than fast, threaded over panels.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "kernels/cpu/linear_int4.h"
#include "kernels/cpu/linear_int4_kernels.h"

namespace tessera::cpu {
namespace {

constexpr int64_t kHalf = kInt4PanelColumns / 2;  // columns per nibble half of a panel

// The steps of one panel from its columns' q values, given step by step (`q`: K / 4 steps of
// kQStepBytes, the 4 values of each of the 32 columns in turn; 0 past N): the low 4 bits, and
// with kSixBit the top 2 (kernels/int4_layout.h). Every byte of the panel is written. Each
// step is a few lanes of 32-bit words side by side, a loop the compiler vectorizes.
constexpr int64_t kQStepBytes = 4 * kInt4PanelColumns;

inline uint32_t q_word(const uint8_t* step, int64_t c) {
  uint32_t w;
  std::memcpy(&w, step + 4 * c, sizeof(w));
  return w;
}

void write_panel_steps(Int4Scheme scheme, int64_t K, const uint8_t* q, uint8_t* panel) {
  const int64_t step = int4_step_bytes(scheme);
  const int top_bits = int4_top_bits(scheme);
  for (int64_t t = 0; t < K / 4; ++t) {
    const uint8_t* w = q + t * kQStepBytes;
    uint8_t* s = panel + t * step;
    for (int64_t j = 0; j < kHalf; ++j) {
      const uint32_t v = (q_word(w, j) & 0x0f0f0f0fu) | ((q_word(w, kHalf + j) & 0x0f0f0f0fu) << 4);
      std::memcpy(s + 4 * j, &v, sizeof(v));
    }
    if (top_bits == 2) {
      for (int64_t e = 0; e < 8; ++e) {  // the word of columns e, 8 + e, 16 + e, 24 + e: bits 0, 2, 4, 6
        uint32_t v = 0;
        for (int64_t pair = 0; pair < 4; ++pair) v |= ((q_word(w, 8 * pair + e) >> 4) & 0x03030303u) << (2 * pair);
        std::memcpy(s + 64 + 4 * e, &v, sizeof(v));
      }
    } else if (top_bits == 1) {
      for (int64_t e = 0; e < 4; ++e) {  // the word of columns e, 4 + e, ..., 28 + e: bits 0 .. 7
        uint32_t v = 0;
        for (int64_t bit = 0; bit < 8; ++bit) v |= ((q_word(w, 4 * bit + e) >> 4) & 0x01010101u) << bit;
        std::memcpy(s + 64 + 4 * e, &v, sizeof(v));
      }
    }
  }
}

// Where column c's q values go in a panel's steps (write_panel_steps): 4 inputs at a time, as
// one 32-bit word, the value of input k + i in byte i.
struct StepColumn {
  uint8_t* steps;
  int64_t c;
  void put4(int64_t k, uint32_t word) const { std::memcpy(steps + k / 4 * kQStepBytes + 4 * c, &word, sizeof(word)); }
  // 4 consecutive values from bytes (a block's values decoded one by one).
  void put_bytes(int64_t k, const uint8_t* q, int64_t n) const {
    for (int64_t i = 0; i < n; i += 4) {
      uint32_t w;
      std::memcpy(&w, q + i, sizeof(w));
      put4(k + i, w);
    }
  }
};

// Packs every panel: column(n, c, out, record) puts column n's K q values through `out` and
// fills its scale data.
template <typename Column>
void pack_panels(Int4Scheme scheme, int64_t N, int64_t K, uint8_t* nibbles, uint8_t* scales, Column column) {
  const int64_t panels = int4_panel_count(N);
  const int64_t panel_bytes = int4_panel_stride(scheme, K), record_bytes = int4_record_stride(scheme, K);
#pragma omp parallel for schedule(dynamic, 1) if (panels > 1)
  for (int64_t p = 0; p < panels; ++p) {
    // Reused by the thread (a fresh buffer of this size is a fresh mapping each time); zero
    // for the columns past N.
    thread_local std::vector<uint8_t> steps;
    steps.assign(static_cast<size_t>(kInt4PanelColumns * K), 0);
    uint8_t* rec = scales + p * record_bytes;
    std::memset(rec, 0, static_cast<size_t>(record_bytes));
    for (int64_t c = 0; c < kInt4PanelColumns && p * kInt4PanelColumns + c < N; ++c) {
      column(p * kInt4PanelColumns + c, c, StepColumn{steps.data(), c}, rec);
    }
    write_panel_steps(scheme, K, steps.data(), nibbles + p * panel_bytes);
  }
}

// Where column c's entries of a kSuperBlock* record live.
struct SuperRecord {
  uint8_t* base;
  uint16_t* d(int64_t c) const { return reinterpret_cast<uint16_t*>(base) + c; }
  uint16_t* dmin(int64_t c) const { return reinterpret_cast<uint16_t*>(base + 64) + c; }
  uint8_t* sc(int64_t g, int64_t c) const { return base + 128 + g * kInt4PanelColumns + c; }
  uint8_t* mn(int64_t g, int64_t c) const { return base + 384 + g * kInt4PanelColumns + c; }
};

// Where column c's entries of a kSixBit record live.
struct SixBitRecord {
  uint8_t* base;
  uint16_t* d(int64_t c) const { return reinterpret_cast<uint16_t*>(base) + c; }
  int8_t* sc(int64_t g, int64_t c) const { return reinterpret_cast<int8_t*>(base + 64 + g * kInt4PanelColumns + c); }
};

// Bits 0-3 of x as bit 4 of bytes 0-3.
inline uint32_t bit4_of_bytes(uint32_t x) {
  return ((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25);
}

// The q values of one block of 32 of q4_0 / q4_1 / q5_0 / q5_1 (inputs k0 ...): byte j of qs
// holds element j in its low nibble and j + 16 in its high one; qh (5-bit types) bit i is
// element i's bit 4. Four elements (one word of qs) at a time.
void q32_values(const uint8_t qs[16], const uint8_t* qh, const StepColumn& out, int64_t k0) {
  uint32_t high = 0;
  if (qh != nullptr) std::memcpy(&high, qh, sizeof(high));
  for (int j = 0; j < 16; j += 4) {
    uint32_t w;
    std::memcpy(&w, qs + j, sizeof(w));
    out.put4(k0 + j, (w & 0x0f0f0f0fu) | bit4_of_bytes(high >> j));
    out.put4(k0 + 16 + j, ((w >> 4) & 0x0f0f0f0fu) | bit4_of_bytes(high >> (16 + j)));
  }
}

// The per-32 block types: q and the record entries of column c, block by block.
template <typename Block>
void pack_32_blocks(Int4Scheme scheme, const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K, uint8_t* nibbles,
                    uint8_t* scales) {
  pack_panels(scheme, N, K, nibbles, scales, [&](int64_t n, int64_t c, const StepColumn& q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kGgmlQK; ++b) {
      const auto block = load_ggml_block<Block>(rows + n * row_bytes, b);
      uint16_t* out = reinterpret_cast<uint16_t*>(rec + b * int4_record_bytes(scheme));
      out[c] = block.d;
      if constexpr (std::is_same_v<Block, BlockQ4_0>) {
        q32_values(block.qs, nullptr, q, b * kGgmlQK);
      } else if constexpr (std::is_same_v<Block, BlockQ5_0>) {
        q32_values(block.qs, block.qh, q, b * kGgmlQK);
      } else {
        // m is minus ggml's min (w = s q - m): the f16's sign bit flipped, exactly.
        out[kInt4PanelColumns + c] = static_cast<uint16_t>(block.m ^ 0x8000u);
        if constexpr (std::is_same_v<Block, BlockQ4_1>) {
          q32_values(block.qs, nullptr, q, b * kGgmlQK);
        } else {
          q32_values(block.qs, block.qh, q, b * kGgmlQK);
        }
      }
    }
  });
}

// q4_K and q5_K: runs of 32 bytes of qs, sub-block 2i in the low nibbles of run i and 2i + 1
// in the high ones; q5_K's bit 4 of element l of sub-block s is bit s of qh[l].
template <typename Block>
void pack_k_blocks(Int4Scheme scheme, const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K, uint8_t* nibbles,
                   uint8_t* scales) {
  pack_panels(scheme, N, K, nibbles, scales, [&](int64_t n, int64_t c, const StepColumn& q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kInt4SuperBlock; ++b) {
      const auto block = load_ggml_block<Block>(rows + n * row_bytes, b);
      const SuperRecord r{rec + b * kInt4SuperRecordBytes};
      *r.d(c) = block.d;
      *r.dmin(c) = block.dmin;
      const int64_t kb = b * kInt4SuperBlock;
      for (int i = 0; i < 4; ++i) {
        for (int l = 0; l < 32; l += 4) {
          uint32_t w;
          std::memcpy(&w, block.qs + 32 * i + l, sizeof(w));
          uint32_t low = w & 0x0f0f0f0fu, high = (w >> 4) & 0x0f0f0f0fu;
          if constexpr (std::is_same_v<Block, BlockQ5_K>) {
            uint32_t h;
            std::memcpy(&h, block.qh + l, sizeof(h));
            low |= ((h >> (2 * i)) & 0x01010101u) << 4;
            high |= ((h >> (2 * i + 1)) & 0x01010101u) << 4;
          }
          q.put4(kb + 64 * i + l, low);
          q.put4(kb + 64 * i + 32 + l, high);
        }
      }
      for (int s = 0; s < 8; ++s) {
        const GgmlKScaleMin sm = ggml_k_scale_min(block.scales, s);
        *r.sc(s, c) = static_cast<uint8_t>(sm.scale);
        *r.mn(s, c) = static_cast<uint8_t>(sm.min);
      }
    }
  });
}

// q6_K: its q values as ggml_q6_k_values gives them, its d and 16 scales.
void pack_q6_k_blocks(const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K, uint8_t* nibbles,
                      uint8_t* scales) {
  pack_panels(Int4Scheme::kSixBit, N, K, nibbles, scales, [&](int64_t n, int64_t c, const StepColumn& q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kInt4SuperBlock; ++b) {
      const auto block = load_ggml_block<BlockQ6_K>(rows + n * row_bytes, b);
      const SixBitRecord r{rec + b * kSixBitRecordBytes};
      *r.d(c) = block.d;
      for (int g = 0; g < 16; ++g) *r.sc(g, c) = block.scales[g];
      uint8_t values[kInt4SuperBlock];
      ggml_q6_k_values(block, values);
      q.put_bytes(b * kInt4SuperBlock, values, kInt4SuperBlock);
    }
  });
}

}  // namespace

void pack_int4_from_blocks(Int4Scheme scheme, const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K,
                           uint8_t* nibbles, uint8_t* scales) {
  TESSERA_CHECK(K % int4_k_multiple(scheme) == 0) << "K=" << K << " for " << int4_scheme_name(scheme);
  switch (scheme) {
    case Int4Scheme::kSymmetric:
      return pack_32_blocks<BlockQ4_0>(scheme, rows, row_bytes, N, K, nibbles, scales);
    case Int4Scheme::kSymmetric5:
      return pack_32_blocks<BlockQ5_0>(scheme, rows, row_bytes, N, K, nibbles, scales);
    case Int4Scheme::kAsymmetric:
      return pack_32_blocks<BlockQ4_1>(scheme, rows, row_bytes, N, K, nibbles, scales);
    case Int4Scheme::kAsymmetric5:
      return pack_32_blocks<BlockQ5_1>(scheme, rows, row_bytes, N, K, nibbles, scales);
    case Int4Scheme::kSuperBlock:
      return pack_k_blocks<BlockQ4_K>(scheme, rows, row_bytes, N, K, nibbles, scales);
    case Int4Scheme::kSuperBlock5:
      return pack_k_blocks<BlockQ5_K>(scheme, rows, row_bytes, N, K, nibbles, scales);
    case Int4Scheme::kSixBit:
      return pack_q6_k_blocks(rows, row_bytes, N, K, nibbles, scales);
  }
}

void quantize_int4(const float* w, int64_t N, int64_t K, uint8_t* nibbles, uint8_t* scales) {
  TESSERA_CHECK(K % kInt4Group == 0) << "K=" << K;
  const int64_t groups = K / kInt4Group;
  const auto column = [&](int64_t n, int64_t c, const StepColumn& q, uint8_t* rec) {
    uint16_t* out = reinterpret_cast<uint16_t*>(rec);
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + n * K + g * kInt4Group;
      float amax = 0.0f, max = 0.0f;
      for (int64_t k = 0; k < kInt4Group; ++k) {
        if (std::fabs(v[k]) > amax) {
          amax = std::fabs(v[k]);
          max = v[k];
        }
      }
      const float d = max / -8.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      uint8_t values[kInt4Group];
      for (int64_t k = 0; k < kInt4Group; ++k) {
        const int qi = static_cast<int>(v[k] * id + 8.5f);
        values[k] = static_cast<uint8_t>(std::clamp(qi, 0, 15));
      }
      q.put_bytes(g * kInt4Group, values, kInt4Group);
      out[g * kInt4PanelColumns + c] = f32_to_f16(d);
    }
  };
  pack_panels(Int4Scheme::kSymmetric, N, K, nibbles, scales, column);
}

void dequantize_int4(Int4Scheme scheme, const uint8_t* nibbles, const uint8_t* scales, int64_t N, int64_t K,
                     float* out) {
  const int64_t panel_bytes = int4_panel_stride(scheme, K), record_bytes = int4_record_stride(scheme, K);
  const int64_t G = int4_weight_group(scheme);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t p = n / kInt4PanelColumns, c = n % kInt4PanelColumns;
    const uint8_t* panel = nibbles + p * panel_bytes;
    const uint8_t* rec = scales + p * record_bytes;
    for (int64_t k = 0; k < K; ++k) {
      float s = 0.0f, m = 0.0f;
      detail::int4_group_scale(scheme, rec, k / G, c, &s, &m);
      out[n * K + k] = s * static_cast<float>(detail::int4_q_at(scheme, panel, c, k)) - m;
    }
  }
}

}  // namespace tessera::cpu
