#pragma once
// The 4-bit weight panels every backend reads (the CPU's kernels/cpu/linear_int4.h, CUDA's
// kernels/cuda/linear_int4.cu), made once at load. Plain C++17: nvcc includes it.
//
// Values. Each weight is w = s * q - m with q in 0..15 and a scale s and an offset m per
// group of 32 consecutive inputs of an output row. Two schemes say where s and m come from:
//  - kSymmetric (llama.cpp's q4_0; Tessera's int4): s is an f16 per group and m = 8 s, so
//    w = s (q - 8).
//  - kSuperBlock (llama.cpp's q4_K): groups come in super-blocks of 8 (256 inputs) holding
//    an f16 d and dmin per output row, and per group 6-bit integers sc and mn: s = d * sc,
//    m = dmin * mn, both exact in f32, exactly as ggml's own decoder computes them.
//
// Layout, for P = ceil(N / 32) panels of 32 output columns (columns past N: q 0, s 0, m 0):
//  - nibbles u8 [P][K / 4][64]: step t of panel p holds inputs 4t .. 4t + 3; byte b = 4 j + i
//    (j < 16, i < 4) holds q[32p + j][4t + i] in its low nibble and q[32p + 16 + j][4t + i]
//    in its high nibble. One 64-byte load thus gives, after a mask and a shift, the 4-input
//    dot-product lanes of vpdpbusd for 16 columns each.
//  - kSymmetric scales: f16 [P][K / 32][32] (the panel's columns' s per group).
//  - kSuperBlock scales: u8 [P][K / 256][640]: f16 d[32], f16 dmin[32], u8 sc[8][32],
//    u8 mn[8][32] (super-block record of the panel's columns).
//
#include <cstdint>

namespace tessera {

enum class Int4Scheme : uint8_t { kSymmetric, kSuperBlock };

inline constexpr int64_t kInt4PanelColumns = 32;
inline constexpr int64_t kInt4Group = 32;        // inputs per scale
inline constexpr int64_t kInt4SuperBlock = 256;  // inputs per kSuperBlock record
inline constexpr int64_t kInt4SuperRecordBytes = 640;

inline int64_t int4_panel_count(int64_t N) { return (N + kInt4PanelColumns - 1) / kInt4PanelColumns; }
// Inputs per unit the scheme needs K to be a multiple of: 32 or 256.
inline int64_t int4_k_multiple(Int4Scheme scheme) {
  return scheme == Int4Scheme::kSymmetric ? kInt4Group : kInt4SuperBlock;
}
// Bytes from one panel's nibbles to the next's, and from one panel's scale records to the next's.
inline int64_t int4_panel_stride(int64_t K) { return K / 4 * 64; }
inline int64_t int4_record_stride(Int4Scheme scheme, int64_t K) {
  return scheme == Int4Scheme::kSymmetric ? (K / kInt4Group) * kInt4PanelColumns * 2
                                          : (K / kInt4SuperBlock) * kInt4SuperRecordBytes;
}
// Bytes of the nibble panels and of the scales of an [N, K] matrix.
inline int64_t int4_nibble_bytes(int64_t N, int64_t K) { return int4_panel_count(N) * int4_panel_stride(K); }
inline int64_t int4_scale_bytes(Int4Scheme scheme, int64_t N, int64_t K) {
  return int4_panel_count(N) * int4_record_stride(scheme, K);
}

}  // namespace tessera
