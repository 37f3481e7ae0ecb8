// Coded bf16 weights: the encoder (a table per row, then codes, low bytes and escapes) and
// the portable decoder.
#include "kernels/coded_bf16.h"

#include <omp.h>

#include <array>
#include <cstring>
#include <vector>

#include "common/check.h"

namespace tessera {
namespace {

using Table = std::array<uint8_t, kCodedBf16TableSize>;

// The table whose window of 7 high bytes (sign aside) holds the most weights of the row.
Table row_table(const uint16_t* row, int64_t K) {
  std::array<int64_t, 128> count{};
  for (int64_t k = 0; k < K; ++k) ++count[(row[k] >> 8) & 0x7f];
  int best = 1;
  int64_t best_count = -1, in_window = 0;
  // Windows start at 1: high byte 0 (zero and the smallest subnormals) has codes 0 and 1.
  for (int j = 1; j < 1 + kCodedBf16Window; ++j) in_window += count[j];
  for (int c0 = 1; c0 + kCodedBf16Window <= 128; ++c0) {
    if (c0 > 1) in_window += count[c0 + kCodedBf16Window - 1] - count[c0 - 1];
    if (in_window > best_count) best_count = in_window, best = c0;
  }
  Table t{};
  t[0] = 0x00;
  t[1] = 0x80;
  for (int j = 0; j < kCodedBf16Window; ++j) {
    t[2 + j] = static_cast<uint8_t>(best + j);
    t[2 + kCodedBf16Window + j] = static_cast<uint8_t>(0x80 | (best + j));
  }
  return t;
}

// code_of[high byte]: its code, or -1 for an escape.
std::array<int8_t, 256> codes_of(const Table& t) {
  std::array<int8_t, 256> code;
  code.fill(-1);
  for (int j = 0; j < kCodedBf16TableSize; ++j) code[t[j]] = static_cast<int8_t>(j);
  return code;
}

float bf16_bits_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

CodedBf16Matrix encode_coded_bf16(const uint16_t* w, int64_t N, int64_t K, TensorArena* arena) {
  TESSERA_CHECK(coded_bf16_codable(K)) << "coded bf16: the input width " << K << " is not a multiple of "
                                       << kCodedBf16Block;
  const int64_t row_bytes = coded_bf16_row_bytes(K);
  CodedBf16Matrix m;
  m.body = arena != nullptr ? arena->zeros({N, row_bytes}, DType::kU8) : Tensor::zeros({N, row_bytes}, DType::kU8);
  // Tables and escape counts first (the side tensor's size), then the codes.
  std::vector<Table> tables(static_cast<size_t>(N));
  std::vector<int64_t> escapes(static_cast<size_t>(N) + 1, 0);
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t n = 0; n < N; ++n) {
    const uint16_t* row = w + n * K;
    tables[n] = row_table(row, K);
    const std::array<int8_t, 256> code = codes_of(tables[n]);
    int64_t e = 0;
    for (int64_t k = 0; k < K; ++k) e += code[row[k] >> 8] < 0;
    escapes[n + 1] = e;
  }
  for (int64_t n = 0; n < N; ++n) escapes[n + 1] += escapes[n];
  const int64_t E = escapes[N];
  m.side = Tensor::zeros({CodedBf16Side::elements(N, E)}, DType::kI32);
  const CodedBf16Side layout = CodedBf16Side::of(N, m.side.numel());
  int32_t* side = m.side.data<int32_t>();
  auto* body = m.body.data<uint8_t>();
  std::memcpy(side + layout.tables(), tables.data(), static_cast<size_t>(N) * kCodedBf16TableSize);
  for (int64_t n = 0; n <= N; ++n) side[layout.row_start() + n] = static_cast<int32_t>(escapes[n]);
  int32_t* columns = side + layout.columns();
  float* values = reinterpret_cast<float*>(side + layout.values());
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t n = 0; n < N; ++n) {
    const uint16_t* row = w + n * K;
    const std::array<int8_t, 256> code = codes_of(tables[n]);
    int64_t e = escapes[n];
    for (int64_t b = 0; b < K / kCodedBf16Block; ++b) {
      uint8_t* codes = body + n * row_bytes + b * kCodedBf16BlockBytes;
      uint8_t* low = codes + 32;
      for (int i = 0; i < kCodedBf16Block; ++i) {
        const int64_t k = b * kCodedBf16Block + i;
        const uint16_t v = row[k];
        int c = code[v >> 8];
        uint8_t lo = static_cast<uint8_t>(v & 0xff);
        if (c < 0) {  // an escape: +0 in the body, the value in the list
          c = 0;
          lo = 0;
          columns[e] = static_cast<int32_t>(k);
          values[e] = bf16_bits_to_f32(v);
          ++e;
        }
        const int p = coded_bf16_position(i);
        low[p] = lo;
        codes[p / 2] |= static_cast<uint8_t>(p % 2 == 0 ? c : c << 4);
      }
    }
  }
  return m;
}

void decode_coded_bf16_rows(const uint8_t* body, const int32_t* side, int64_t N, int64_t side_elements, int64_t K,
                            int64_t n0, int64_t n1, uint16_t* out) {
  const CodedBf16Side layout = CodedBf16Side::of(N, side_elements);
  const auto* tables = reinterpret_cast<const uint8_t*>(side + layout.tables());
  const int64_t row_bytes = coded_bf16_row_bytes(K);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* table = tables + n * kCodedBf16TableSize;
    uint16_t* dst = out + (n - n0) * K;
    for (int64_t b = 0; b < K / kCodedBf16Block; ++b) {
      const uint8_t* codes = body + n * row_bytes + b * kCodedBf16BlockBytes;
      for (int i = 0; i < kCodedBf16Block; ++i) {
        const int p = coded_bf16_position(i);
        const int c = p % 2 == 0 ? codes[p / 2] & 0x0f : codes[p / 2] >> 4;
        dst[b * kCodedBf16Block + i] = static_cast<uint16_t>(table[c] << 8 | codes[32 + p]);
      }
    }
    for (int32_t e = side[layout.row_start() + n]; e < side[layout.row_start() + n + 1]; ++e) {
      uint32_t bits;
      std::memcpy(&bits, side + layout.values() + e, sizeof bits);
      dst[side[layout.columns() + e]] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

}  // namespace tessera
