// The 4-bit panels of linear_int4.h: packing from ggml blocks and from floats, and the
// float matrix they stand for. Load-time code: clear rather than fast, threaded over panels.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "kernels/cpu/linear_int4.h"

namespace tessera::cpu {
namespace {

constexpr int64_t kHalf = kInt4PanelColumns / 2;  // columns per nibble half of a panel

// The nibbles of one panel from its columns' q values: q(c, k) for column c < 32 of the
// panel (0 past N).
template <typename QOf>
void write_panel_nibbles(int64_t K, QOf q, uint8_t* panel) {
  for (int64_t j = 0; j < kHalf; ++j) {
    for (int64_t k = 0; k < K; ++k) {
      panel[(k / 4) * 64 + 4 * j + (k % 4)] = static_cast<uint8_t>(q(j, k) | (q(kHalf + j, k) << 4));
    }
  }
}

// One q4_0 row: its K q values (0..15) and its K / 32 f16 scales.
void q4_0_column(const uint8_t* row, int64_t K, uint8_t* q, uint16_t* s) {
  for (int64_t b = 0; b < K / kGgmlQK; ++b) {
    const auto block = load_ggml_block<BlockQ4_0>(row, b);
    s[b] = block.d;
    for (int l = 0; l < kGgmlQK / 2; ++l) {
      q[b * kGgmlQK + l] = block.qs[l] & 0x0f;
      q[b * kGgmlQK + l + 16] = block.qs[l] >> 4;
    }
  }
}

// Packs every panel: column(n, q, record) fills column n's q values and its scale data.
template <typename Column>
void pack_panels(Int4Scheme scheme, int64_t N, int64_t K, uint8_t* nibbles, uint8_t* scales, Column column) {
  const int64_t panels = int4_panel_count(N);
  const int64_t panel_bytes = int4_panel_stride(K), record_bytes = int4_record_stride(scheme, K);
#pragma omp parallel for schedule(dynamic, 1) if (panels > 1)
  for (int64_t p = 0; p < panels; ++p) {
    std::vector<uint8_t> q(static_cast<size_t>(kInt4PanelColumns * K), 0);
    uint8_t* rec = scales + p * record_bytes;
    std::memset(rec, 0, static_cast<size_t>(record_bytes));
    for (int64_t c = 0; c < kInt4PanelColumns && p * kInt4PanelColumns + c < N; ++c) {
      column(p * kInt4PanelColumns + c, c, q.data() + c * K, rec);
    }
    write_panel_nibbles(K, [&](int64_t c, int64_t k) { return q[static_cast<size_t>(c * K + k)]; },
                        nibbles + p * panel_bytes);
  }
}

// Where column c's entries of a kSuperBlock record live.
struct SuperRecord {
  uint8_t* base;
  uint16_t* d(int64_t c) const { return reinterpret_cast<uint16_t*>(base) + c; }
  uint16_t* dmin(int64_t c) const { return reinterpret_cast<uint16_t*>(base + 64) + c; }
  uint8_t* sc(int64_t g, int64_t c) const { return base + 128 + g * kInt4PanelColumns + c; }
  uint8_t* mn(int64_t g, int64_t c) const { return base + 384 + g * kInt4PanelColumns + c; }
};

// q4_K's 6-bit scale and min of sub-block s (ggml's packing of 12 bytes).
void k_scale_min(const uint8_t packed[12], int s, uint8_t* scale, uint8_t* min) {
  if (s < 4) {
    *scale = packed[s] & 0x3f;
    *min = packed[s + 4] & 0x3f;
  } else {
    *scale = static_cast<uint8_t>((packed[s + 4] & 0x0f) | ((packed[s - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((packed[s + 4] >> 4) | ((packed[s] >> 6) << 4));
  }
}

}  // namespace

const char* int4_scheme_name(Int4Scheme scheme) {
  return scheme == Int4Scheme::kSymmetric ? "q4_0-style" : "q4_K-style";
}

void pack_int4_from_q4_0(const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K, uint8_t* nibbles,
                         uint8_t* scales) {
  TESSERA_CHECK(K % kInt4Group == 0) << "K=" << K;
  const int64_t groups = K / kInt4Group;
  pack_panels(Int4Scheme::kSymmetric, N, K, nibbles, scales, [&](int64_t n, int64_t c, uint8_t* q, uint8_t* rec) {
    std::vector<uint16_t> s(static_cast<size_t>(groups));
    q4_0_column(rows + n * row_bytes, K, q, s.data());
    uint16_t* out = reinterpret_cast<uint16_t*>(rec);
    for (int64_t g = 0; g < groups; ++g) out[g * kInt4PanelColumns + c] = s[static_cast<size_t>(g)];
  });
}

void pack_int4_from_q4_k(const uint8_t* rows, int64_t row_bytes, int64_t N, int64_t K, uint8_t* nibbles,
                         uint8_t* scales) {
  TESSERA_CHECK(K % kInt4SuperBlock == 0) << "K=" << K;
  pack_panels(Int4Scheme::kSuperBlock, N, K, nibbles, scales, [&](int64_t n, int64_t c, uint8_t* q, uint8_t* rec) {
    for (int64_t b = 0; b < K / kInt4SuperBlock; ++b) {
      const auto block = load_ggml_block<BlockQ4_K>(rows + n * row_bytes, b);
      const SuperRecord r{rec + b * kInt4SuperRecordBytes};
      *r.d(c) = block.d;
      *r.dmin(c) = block.dmin;
      uint8_t* qb = q + b * kInt4SuperBlock;
      // Run i of 32 bytes: sub-block 2i in the low nibbles, 2i + 1 in the high ones.
      for (int i = 0; i < 4; ++i) {
        for (int l = 0; l < 32; ++l) {
          qb[64 * i + l] = block.qs[32 * i + l] & 0x0f;
          qb[64 * i + 32 + l] = block.qs[32 * i + l] >> 4;
        }
      }
      for (int s = 0; s < 8; ++s) k_scale_min(block.scales, s, r.sc(s, c), r.mn(s, c));
    }
  });
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
  const int64_t panel_bytes = int4_panel_stride(K), record_bytes = int4_record_stride(scheme, K);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t p = n / kInt4PanelColumns, c = n % kInt4PanelColumns;
    const uint8_t* panel = nibbles + p * panel_bytes;
    const uint8_t* rec = scales + p * record_bytes;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t byte = panel[(k / 4) * 64 + 4 * (c % kHalf) + k % 4];
      const int q = c < kHalf ? byte & 0x0f : byte >> 4;
      const int64_t g = k / kInt4Group;
      float s, m;
      if (scheme == Int4Scheme::kSymmetric) {
        s = f16_to_f32(reinterpret_cast<const uint16_t*>(rec)[g * kInt4PanelColumns + c]);
        m = 8.0f * s;
      } else {
        const SuperRecord r{const_cast<uint8_t*>(rec + (k / kInt4SuperBlock) * kInt4SuperRecordBytes)};
        const int64_t sub = g % 8;
        s = f16_to_f32(*r.d(c)) * static_cast<float>(*r.sc(sub, c));
        m = f16_to_f32(*r.dmin(c)) * static_cast<float>(*r.mn(sub, c));
      }
      out[n * K + k] = s * static_cast<float>(q) - m;
    }
  }
}

}  // namespace tessera::cpu
