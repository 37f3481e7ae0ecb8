#pragma once
// The low-bit weight panels every backend reads (the CPU's kernels/cpu/linear_int4.h, CUDA's
// kernels/cuda/linear_int4.cu): 4-bit, and 5- and 6-bit as the 4-bit nibbles plus a plane of
// top bits. Made once at load. Plain C++17: nvcc includes it.
//
// Values. Each weight is w = s * q - m with an unsigned q and a scale s and an offset m per
// group of consecutive inputs of an output row. The schemes, one per ggml block type they hold
// value for value:
//  - kSymmetric (q4_0; Tessera's int4): q 0..15, groups of 32, s an f16, m = 8 s.
//  - kSymmetric5 (q5_0): q 0..31, groups of 32, s an f16, m = 16 s.
//  - kAsymmetric (q4_1): q 0..15, groups of 32, s and m f16 (m is minus ggml's min).
//  - kAsymmetric5 (q5_1): as kAsymmetric with q 0..31.
//  - kSuperBlock (q4_K): q 0..15, groups of 32 in super-blocks of 8 (256 inputs) holding an
//    f16 d and dmin per output row, and per group 6-bit integers sc and mn: s = d * sc,
//    m = dmin * mn, both exact in f32, exactly as ggml's own decoder computes them.
//  - kSuperBlock5 (q5_K): as kSuperBlock with q 0..31.
//  - kSixBit (q6_K): q 0..63, groups of 16 in super-blocks of 16 (256 inputs) holding an f16
//    d per output row and per group a signed 8-bit sc: s = d * sc (exact), m = 32 s.
//
// Layout, for P = ceil(N / 32) panels of 32 output columns (columns past N: q 0, s 0, m 0),
// in steps of 4 inputs: panel p holds K / 4 steps, int4_step_bytes(scheme) apart.
//  - The first 64 bytes of step t hold the low 4 bits of inputs 4t .. 4t + 3: byte b = 4 j + i
//    (j < 16, i < 4) holds q[32p + j][4t + i] in its low nibble and q[32p + 16 + j][4t + i] in
//    its high nibble. One 64-byte load thus gives, after a mask and a shift, the 4-input
//    dot-product lanes of vpdpbusd for 16 columns each.
//  - 2 top bits (kSixBit): 32 more bytes; those of column c, input 4t + i, are bits 2 (c / 8),
//    2 (c / 8) + 1 of byte 4 (c % 8) + i. Broadcast to 64 bytes, each byte sits at the position
//    of its column's nibble byte in both 32-byte halves, so a shift per half lines the 2 bits
//    up with the nibbles (columns 0-7 shift by 0, 8-15 by 2, 16-23 by 4, 24-31 by 6).
//  - 1 top bit (the 5-bit schemes): 16 more bytes; that of column c, input 4t + i, is bit
//    4 (c / 16) + (c % 16) / 4 of byte 4 (c % 4) + i: broadcast to the four 16-byte lanes of 64
//    bytes, each byte sits at its column's nibble byte position in every lane, lane L holding
//    columns 4L .. 4L + 3 (low nibbles, bit L) and 16 + 4L .. (high nibbles, bit 4 + L).
//  - Scales, one record per group (kSymmetric*, kAsymmetric*) or super-block of a panel:
//    kSymmetric, kSymmetric5: f16 [P][K / 32][32] (the columns' s);
//    kAsymmetric, kAsymmetric5: f16 [P][K / 32][64] (s[32], then m[32]);
//    kSuperBlock, kSuperBlock5: u8 [P][K / 256][640]: f16 d[32], f16 dmin[32], u8 sc[8][32],
//    u8 mn[8][32];
//    kSixBit: i8 [P][K / 256][576]: f16 d[32], i8 sc[16][32].
//  The scales' dtype and record size and the step size tell the schemes apart
//  (Backend's int4_scheme_of).
//
#include <cstdint>

namespace tessera {

enum class Int4Scheme : uint8_t {
  kSymmetric,
  kSuperBlock,
  kSixBit,
  kSymmetric5,
  kAsymmetric,
  kAsymmetric5,
  kSuperBlock5,
};
inline constexpr int kInt4SchemeCount = 7;

inline constexpr int64_t kInt4PanelColumns = 32;
inline constexpr int64_t kInt4Group = 32;        // inputs per scale of the 32-group schemes (and of x)
inline constexpr int64_t kSixBitGroup = 16;      // inputs per scale of kSixBit
inline constexpr int64_t kInt4SuperBlock = 256;  // inputs per kSuperBlock* / kSixBit record
inline constexpr int64_t kInt4SuperRecordBytes = 640;
inline constexpr int64_t kSixBitRecordBytes = 576;

inline int64_t int4_panel_count(int64_t N) { return (N + kInt4PanelColumns - 1) / kInt4PanelColumns; }

// Top bits per weight beyond the 4 of the nibbles: 0, 1 or 2.
constexpr int int4_top_bits(Int4Scheme scheme) {
  switch (scheme) {
    case Int4Scheme::kSixBit:
      return 2;
    case Int4Scheme::kSymmetric5:
    case Int4Scheme::kAsymmetric5:
    case Int4Scheme::kSuperBlock5:
      return 1;
    default:
      return 0;
  }
}
// m = o s for the schemes whose m is a multiple of s: o, the q value that stands for 0
// (8, 16 or 32); 0 for the others (m a record entry of its own, or s and m from sc and mn).
constexpr int int4_q_offset(Int4Scheme scheme) {
  switch (scheme) {
    case Int4Scheme::kSymmetric:
      return 8;
    case Int4Scheme::kSymmetric5:
      return 16;
    case Int4Scheme::kSixBit:
      return 32;
    default:
      return 0;
  }
}
// The offset m is a record entry of its own (not a multiple of s).
constexpr bool int4_asymmetric(Int4Scheme scheme) {
  return scheme == Int4Scheme::kAsymmetric || scheme == Int4Scheme::kAsymmetric5;
}
constexpr bool int4_super_block(Int4Scheme scheme) {
  return scheme == Int4Scheme::kSuperBlock || scheme == Int4Scheme::kSuperBlock5;
}
// Inputs per weight scale: 32, or 16 for kSixBit.
constexpr int64_t int4_weight_group(Int4Scheme scheme) {
  return scheme == Int4Scheme::kSixBit ? kSixBitGroup : kInt4Group;
}
// Inputs per scale record, which K must be a multiple of: 32 or 256.
constexpr int64_t int4_k_multiple(Int4Scheme scheme) {
  return int4_super_block(scheme) || scheme == Int4Scheme::kSixBit ? kInt4SuperBlock : kInt4Group;
}
// Bytes of one step of 4 inputs of a panel: 64, 80 or 96.
constexpr int64_t int4_step_bytes(Int4Scheme scheme) { return 64 + 16 * int4_top_bits(scheme); }
// Bytes of one scale record of a panel.
constexpr int64_t int4_record_bytes(Int4Scheme scheme) {
  if (int4_super_block(scheme)) return kInt4SuperRecordBytes;
  if (scheme == Int4Scheme::kSixBit) return kSixBitRecordBytes;
  return kInt4PanelColumns * 2 * (int4_asymmetric(scheme) ? 2 : 1);
}
// Bytes from one panel's steps to the next's, and from one panel's scale records to the next's.
constexpr int64_t int4_panel_stride(Int4Scheme scheme, int64_t K) { return K / 4 * int4_step_bytes(scheme); }
constexpr int64_t int4_record_stride(Int4Scheme scheme, int64_t K) {
  return K / int4_k_multiple(scheme) * int4_record_bytes(scheme);
}
// "q4_0-style", "q4_K-style", ...: the ggml block type a scheme holds value for value.
constexpr const char* int4_scheme_name(Int4Scheme scheme) {
  switch (scheme) {
    case Int4Scheme::kSymmetric:
      return "q4_0-style";
    case Int4Scheme::kSuperBlock:
      return "q4_K-style";
    case Int4Scheme::kSixBit:
      return "q6_K-style";
    case Int4Scheme::kSymmetric5:
      return "q5_0-style";
    case Int4Scheme::kAsymmetric:
      return "q4_1-style";
    case Int4Scheme::kAsymmetric5:
      return "q5_1-style";
    case Int4Scheme::kSuperBlock5:
      break;
  }
  return "q5_K-style";
}

// Bytes of the panels and of the scales of an [N, K] matrix.
constexpr int64_t int4_nibble_bytes(Int4Scheme scheme, int64_t N, int64_t K) {
  return (N + kInt4PanelColumns - 1) / kInt4PanelColumns * int4_panel_stride(scheme, K);
}
constexpr int64_t int4_scale_bytes(Int4Scheme scheme, int64_t N, int64_t K) {
  return (N + kInt4PanelColumns - 1) / kInt4PanelColumns * int4_record_stride(scheme, K);
}

}  // namespace tessera
