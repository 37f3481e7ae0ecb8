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

// The steps of one panel from its columns' q values (`q`: 32 columns of K values, column c
// at q + c K; 0 past N): the low 4 bits, and with kSixBit the top 2 (kernels/int4_layout.h).
// Every byte of the panel is written, 4 inputs (a 32-bit word) at a time.
void write_panel_steps(Int4Scheme scheme, int64_t K, const uint8_t* q, uint8_t* panel) {
  const int64_t step = int4_step_bytes(scheme);
  auto four = [&](int64_t c, int64_t t) {
    uint32_t w;
    std::memcpy(&w, q + c * K + 4 * t, sizeof(w));
    return w;
  };
  for (int64_t t = 0; t < K / 4; ++t) {
    uint8_t* s = panel + t * step;
    for (int64_t j = 0; j < kHalf; ++j) {
      const uint32_t v = (four(j, t) & 0x0f0f0f0fu) | ((four(kHalf + j, t) & 0x0f0f0f0fu) << 4);
      std::memcpy(s + 4 * j, &v, sizeof(v));
    }
    if (int4_top_bits(scheme) == 2) {
      for (int64_t e = 0; e < 8; ++e) {  // the word of columns e, 8 + e, 16 + e, 24 + e: bits 0, 2, 4, 6
        uint32_t v = 0;
        for (int64_t pair = 0; pair < 4; ++pair) v |= ((four(8 * pair + e, t) >> 4) & 0x03030303u) << (2 * pair);
        std::memcpy(s + 64 + 4 * e, &v, sizeof(v));
      }
    } else if (int4_top_bits(scheme) == 1) {
      for (int64_t e = 0; e < 4; ++e) {  // the word of columns e, 4 + e, ..., 28 + e: bits 0 .. 7
        uint32_t v = 0;
        for (int64_t bit = 0; bit < 8; ++bit) v |= ((four(4 * bit + e, t) >> 4) & 0x01010101u) << bit;
        std::memcpy(s + 64 + 4 * e, &v, sizeof(v));
      }
    }
  }
}

// Packs every panel: column(n, q, record) fills column n's q values and its scale data.
template <typename Column>
void pack_panels(Int4Scheme scheme, int64_t N, int64_t K, uint8_t* nibbles, uint8_t* scales, Column column) {
  const int64_t panels = int4_panel_count(N);
  const int64_t panel_bytes = int4_panel_stride(scheme, K), record_bytes = int4_record_stride(scheme, K);
#pragma omp parallel for schedule(dynamic, 1) if (panels > 1)
  for (int64_t p = 0; p < panels; ++p) {
    // Reused by the thread (a fresh buffer of this size is a fresh mapping each time); zero
    // for the columns past N.
    thread_local std::vector<uint8_t> q;
    q.assign(static_cast<size_t>(kInt4PanelColumns * K), 0);
    uint8_t* rec = scales + p * record_bytes;
    std::memset(rec, 0, static_cast<size_t>(record_bytes));
    for (int64_t c = 0; c < kInt4PanelColumns && p * kInt4PanelColumns + c < N; ++c) {
      column(p * kInt4PanelColumns + c, c, q.data() + c * K, rec);
    }
    write_panel_steps(scheme, K, q.data(), nibbles + p * panel_bytes);
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

// The q values of one block of 32 of q4_0 / q4_1 / q5_0 / q5_1: byte j of qs holds element j
// in its low nibble and j + 16 in its high one; qh (5-bit types) bit i is element i's bit 4.
void q32_values(const uint8_t qs[16], const uint8_t* qh, uint8_t* q) {
  uint32_t high = 0;
  if (qh != nullptr) std::memcpy(&high, qh, sizeof(high));
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0x0f) | (((high >> j) & 1) << 4));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((high >> (j + 16)) & 1) << 4));
  }
}

// The per-32 block types: q and the record entries of column c, block by block.
template <typename Block>
void pack_32_blocks(Int4Scheme scheme, const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K, uint8_t* nibbles,
                    uint8_t* scales) {
  pack_panels(scheme, N, K, nibbles, scales, [&](int64_t n, int64_t c, uint8_t* q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kGgmlQK; ++b) {
      const auto block = load_ggml_block<Block>(rows + n * row_bytes, b);
      uint16_t* out = reinterpret_cast<uint16_t*>(rec + b * int4_record_bytes(scheme));
      out[c] = block.d;
      if constexpr (std::is_same_v<Block, BlockQ4_0>) {
        q32_values(block.qs, nullptr, q + b * kGgmlQK);
      } else if constexpr (std::is_same_v<Block, BlockQ5_0>) {
        q32_values(block.qs, block.qh, q + b * kGgmlQK);
      } else {
        // m is minus ggml's min (w = s q - m): the f16's sign bit flipped, exactly.
        out[kInt4PanelColumns + c] = static_cast<uint16_t>(block.m ^ 0x8000u);
        if constexpr (std::is_same_v<Block, BlockQ4_1>) {
          q32_values(block.qs, nullptr, q + b * kGgmlQK);
        } else {
          q32_values(block.qs, block.qh, q + b * kGgmlQK);
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
  pack_panels(scheme, N, K, nibbles, scales, [&](int64_t n, int64_t c, uint8_t* q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kInt4SuperBlock; ++b) {
      const auto block = load_ggml_block<Block>(rows + n * row_bytes, b);
      const SuperRecord r{rec + b * kInt4SuperRecordBytes};
      *r.d(c) = block.d;
      *r.dmin(c) = block.dmin;
      uint8_t* qb = q + b * kInt4SuperBlock;
      for (int i = 0; i < 4; ++i) {
        for (int l = 0; l < 32; ++l) {
          int low = block.qs[32 * i + l] & 0x0f, high = block.qs[32 * i + l] >> 4;
          if constexpr (std::is_same_v<Block, BlockQ5_K>) {
            low |= ((block.qh[l] >> (2 * i)) & 1) << 4;
            high |= ((block.qh[l] >> (2 * i + 1)) & 1) << 4;
          }
          qb[64 * i + l] = static_cast<uint8_t>(low);
          qb[64 * i + 32 + l] = static_cast<uint8_t>(high);
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
  pack_panels(Int4Scheme::kSixBit, N, K, nibbles, scales, [&](int64_t n, int64_t c, uint8_t* q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kInt4SuperBlock; ++b) {
      const auto block = load_ggml_block<BlockQ6_K>(rows + n * row_bytes, b);
      const SixBitRecord r{rec + b * kSixBitRecordBytes};
      *r.d(c) = block.d;
      for (int g = 0; g < 16; ++g) *r.sc(g, c) = block.scales[g];
      ggml_q6_k_values(block, q + b * kInt4SuperBlock);
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
  pack_panels(Int4Scheme::kSymmetric, N, K, nibbles, scales, [&](int64_t n, int64_t c, uint8_t* q, uint8_t* rec) {
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
      for (int64_t k = 0; k < kInt4Group; ++k) {
        const int qi = static_cast<int>(v[k] * id + 8.5f);
        q[g * kInt4Group + k] = static_cast<uint8_t>(std::clamp(qi, 0, 15));
      }
      out[g * kInt4PanelColumns + c] = f32_to_f16(d);
    }
  });
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
