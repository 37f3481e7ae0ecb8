#pragma once
// Coded bf16 weights: a bf16 matrix stored in 12 bits per weight instead of 16, losslessly
// (docs/quantization.md, "Coded bf16"). Every backend reads it (the CPU's
// kernels/cpu/linear_coded_bf16.h, CUDA's kernels/cuda/linear_coded_bf16.cu); made once at
// load (kernels/coded_bf16.h). Plain C++17: nvcc includes it.
//
// Why it works. A bf16 value is a high byte (sign and the top 7 exponent bits) and a low byte
// (the last exponent bit and 7 mantissa bits). The weights of one output row span few binades,
// so their high bytes take few values: 7 consecutive exponent pairs of either sign (14
// binades) hold all but ~3e-4 of a Gaussian row's weights. Each weight keeps its low byte and
// replaces its high byte by a 4-bit code into its row's table of 16 high bytes. Decode is
// memory bound, so 3/4 of the bytes read is up to 4/3 the speed at the same arithmetic.
//
// Values. Row n's table T[16] holds 0x00 and 0x80 (codes 0 and 1), then 7 consecutive
// high bytes c0 .. c0 + 6 (codes 2 .. 8) and the same with the sign set (codes 9 .. 15).
// A weight whose high byte is in its row's table is (T[code] << 8) | low byte, exactly. One
// whose high byte is not (an escape: a far outlier, a tiny value, inf or NaN) is stored as
// code 0 with low byte 0, which decodes to +0, and its exact value is in the row's escape
// list, which a kernel adds as value * x[column].
//
// Layout, for an [N, K] matrix with K a multiple of kCodedBf16Block:
//  - body: u8 [N, K / 64 * 96]. Each block of 64 inputs is 96 bytes: 32 bytes of codes, then
//    64 low bytes. Input e of the block sits at byte position p = coded_bf16_position(e): its
//    low byte at 32 + p, its code in byte p / 2 (low nibble when p is even, high when odd).
//    The order is the one AVX-512's unpacklo / unpackhi of (low bytes, high bytes) give, so
//    one block decodes to inputs 0 .. 31 and 32 .. 63 in order with no shuffle.
//  - side: i32 [4 N + (N + 1) + 2 E], E the escape count: the tables (16 bytes per row, row
//    n at bytes 16 n), then row_start[N + 1] (row n's escapes are [row_start[n],
//    row_start[n + 1])), then E columns, then E values (the f32 bits of each exact value).
#include <cstdint>

// The layout's arithmetic runs in CUDA kernels too.
#if defined(__CUDACC__)
#define TESSERA_CODED_BF16_HD __host__ __device__
#else
#define TESSERA_CODED_BF16_HD
#endif

namespace tessera {

inline constexpr int64_t kCodedBf16Block = 64;       // inputs per block
inline constexpr int64_t kCodedBf16BlockBytes = 96;  // 32 code bytes + 64 low bytes
inline constexpr int kCodedBf16TableSize = 16;
inline constexpr int kCodedBf16Window = 7;  // consecutive high bytes per sign in a table

TESSERA_CODED_BF16_HD inline constexpr bool coded_bf16_codable(int64_t K) { return K > 0 && K % kCodedBf16Block == 0; }
TESSERA_CODED_BF16_HD inline constexpr int64_t coded_bf16_row_bytes(int64_t K) { return K / kCodedBf16Block * kCodedBf16BlockBytes; }
// The input width of a body of `row_bytes` per row.
TESSERA_CODED_BF16_HD inline constexpr int64_t coded_bf16_inputs(int64_t row_bytes) {
  return row_bytes / kCodedBf16BlockBytes * kCodedBf16Block;
}

// Byte position of input e (0 .. 63) of a block: AVX-512's unpack of bytes works within
// 16-byte lanes, taking bytes 0 .. 7 of each lane (unpacklo) or 8 .. 15 (unpackhi).
TESSERA_CODED_BF16_HD inline constexpr int coded_bf16_position(int e) {
  return e < 32 ? 16 * (e / 8) + e % 8 : 16 * ((e - 32) / 8) + 8 + (e - 32) % 8;
}

// Where the parts of a side tensor of `side_elements` i32 for N rows are (in i32 elements).
struct CodedBf16Side {
  int64_t rows = 0, escapes = 0;
  TESSERA_CODED_BF16_HD static CodedBf16Side of(int64_t rows, int64_t side_elements) {
    return {rows, (side_elements - 5 * rows - 1) / 2};
  }
  TESSERA_CODED_BF16_HD static int64_t elements(int64_t rows, int64_t escapes) { return 5 * rows + 1 + 2 * escapes; }
  // Whether side_elements is a side tensor's size for `rows` rows (some escape count).
  TESSERA_CODED_BF16_HD static bool fits(int64_t rows, int64_t side_elements) {
    return side_elements >= 5 * rows + 1 && (side_elements - 5 * rows - 1) % 2 == 0;
  }
  TESSERA_CODED_BF16_HD int64_t tables() const { return 0; }
  TESSERA_CODED_BF16_HD int64_t row_start() const { return 4 * rows; }
  TESSERA_CODED_BF16_HD int64_t columns() const { return 5 * rows + 1; }
  TESSERA_CODED_BF16_HD int64_t values() const { return 5 * rows + 1 + escapes; }
};

}  // namespace tessera
