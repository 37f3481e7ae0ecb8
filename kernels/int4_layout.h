#pragma once
// The 4-bit (and q6_K's 6-bit) weight panels every backend reads (the CPU's
// kernels/cpu/linear_int4.h, CUDA's kernels/cuda/linear_int4.cu), made once at load. Plain
// C++17: nvcc includes it.
//
// Values. Each weight is w = s * q - m with an unsigned q and a scale s and an offset m per
// group of consecutive inputs of an output row. Three schemes say where they come from:
//  - kSymmetric (llama.cpp's q4_0; Tessera's int4): q in 0..15, groups of 32, s an f16 per
//    group and m = 8 s, so w = s (q - 8).
//  - kSuperBlock (llama.cpp's q4_K): q in 0..15, groups of 32 in super-blocks of 8 (256
//    inputs) holding an f16 d and dmin per output row, and per group 6-bit integers sc and
//    mn: s = d * sc, m = dmin * mn, both exact in f32, exactly as ggml's own decoder does.
//  - kSixBit (llama.cpp's q6_K): q in 0..63, groups of 16 in super-blocks of 16 (256 inputs)
//    holding an f16 d per output row and per group a signed 8-bit sc: s = d * sc (exact in
//    f32), m = 32 s, so w = s (q - 32).
//
// Layout, for P = ceil(N / 32) panels of 32 output columns (columns past N: q 0, s 0, m 0),
// in steps of 4 inputs: panel p holds K / 4 steps, int4_step_bytes(scheme) apart.
//  - The first 64 bytes of step t hold the low 4 bits of inputs 4t .. 4t + 3: byte b = 4 j + i
//    (j < 16, i < 4) holds q[32p + j][4t + i] in its low nibble and q[32p + 16 + j][4t + i] in
//    its high nibble. One 64-byte load thus gives, after a mask and a shift, the 4-input
//    dot-product lanes of vpdpbusd for 16 columns each.
//  - kSixBit only: 32 more bytes hold the top 2 bits: those of column c (< 32), input
//    4t + i, are bits 2 (c / 8), 2 (c / 8) + 1 of byte 4 (c % 8) + i. Broadcast to 64 bytes,
//    that byte sits at the position of the nibble byte of its column in both 32-byte halves,
//    so a per-half shift lines the 2 bits up with the nibbles (columns 0-7 shift by 0, 8-15
//    by 2, 16-23 by 4, 24-31 by 6).
//  - kSymmetric scales: f16 [P][K / 32][32] (the panel's columns' s per group).
//  - kSuperBlock scales: u8 [P][K / 256][640]: f16 d[32], f16 dmin[32], u8 sc[8][32],
//    u8 mn[8][32] (super-block record of the panel's columns).
//  - kSixBit scales: i8 [P][K / 256][576]: f16 d[32], i8 sc[16][32].
//
#include <cstdint>

namespace tessera {

enum class Int4Scheme : uint8_t { kSymmetric, kSuperBlock, kSixBit };

inline constexpr int64_t kInt4PanelColumns = 32;
inline constexpr int64_t kInt4Group = 32;        // inputs per scale of the 4-bit schemes (and of x)
inline constexpr int64_t kSixBitGroup = 16;      // inputs per scale of kSixBit
inline constexpr int64_t kInt4SuperBlock = 256;  // inputs per kSuperBlock / kSixBit record
inline constexpr int64_t kInt4SuperRecordBytes = 640;
inline constexpr int64_t kSixBitRecordBytes = 576;

inline int64_t int4_panel_count(int64_t N) { return (N + kInt4PanelColumns - 1) / kInt4PanelColumns; }
// Inputs per weight scale: 32 or 16.
inline int64_t int4_weight_group(Int4Scheme scheme) {
  return scheme == Int4Scheme::kSixBit ? kSixBitGroup : kInt4Group;
}
// Inputs per unit the scheme needs K to be a multiple of: 32 or 256.
inline int64_t int4_k_multiple(Int4Scheme scheme) {
  return scheme == Int4Scheme::kSymmetric ? kInt4Group : kInt4SuperBlock;
}
// Bytes of one step of 4 inputs of a panel: 64, or 96 with kSixBit's top bits.
inline int64_t int4_step_bytes(Int4Scheme scheme) { return scheme == Int4Scheme::kSixBit ? 96 : 64; }
// Bytes of one scale record (a group's, or a super-block's) of a panel.
inline int64_t int4_record_bytes(Int4Scheme scheme) {
  switch (scheme) {
    case Int4Scheme::kSymmetric:
      return kInt4PanelColumns * 2;
    case Int4Scheme::kSuperBlock:
      return kInt4SuperRecordBytes;
    case Int4Scheme::kSixBit:
      break;
  }
  return kSixBitRecordBytes;
}
// Bytes from one panel's steps to the next's, and from one panel's scale records to the next's.
inline int64_t int4_panel_stride(Int4Scheme scheme, int64_t K) { return K / 4 * int4_step_bytes(scheme); }
inline int64_t int4_record_stride(Int4Scheme scheme, int64_t K) {
  return K / int4_k_multiple(scheme) * int4_record_bytes(scheme);
}
// Bytes of the panels and of the scales of an [N, K] matrix.
inline int64_t int4_nibble_bytes(Int4Scheme scheme, int64_t N, int64_t K) {
  return int4_panel_count(N) * int4_panel_stride(scheme, K);
}
inline int64_t int4_scale_bytes(Int4Scheme scheme, int64_t N, int64_t K) {
  return int4_panel_count(N) * int4_record_stride(scheme, K);
}

}  // namespace tessera
