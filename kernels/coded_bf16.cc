// Coded bf16 weights: the encoder (a table per row, then codes, low bytes and escapes) and
// the portable decoder.
#include "kernels/coded_bf16.h"

#include <immintrin.h>
#include <omp.h>

#include <array>
#include <cstring>
#include <vector>

#include "common/check.h"

namespace tessera {
namespace {

using Table = std::array<uint8_t, kCodedBf16TableSize>;

// A row's table: the window of 7 high bytes (sign aside) that holds the most of its weights,
// and how many weights fall outside it (the escapes).
struct RowTable {
  Table table{};
  int first = 1;  // the window's first high byte (sign aside)
  int64_t escapes = 0;
};

RowTable row_table(const uint16_t* row, int64_t K) {
  // Four partial histograms: neighbouring weights mostly share a high byte, and one array's
  // increments would wait on each other's stores.
  std::array<std::array<int32_t, 128>, 4> part{};
  for (int64_t k = 0; k < K; k += 4) {
    for (int j = 0; j < 4; ++j) ++part[j][(row[k + j] >> 8) & 0x7f];
  }
  std::array<int64_t, 128> count{};
  for (int c = 0; c < 128; ++c) count[c] = int64_t{part[0][c]} + part[1][c] + part[2][c] + part[3][c];
  int best = 1;
  int64_t best_count = -1, in_window = 0;
  // Windows start at 1: high byte 0 (zero and the smallest subnormals) has codes 0 and 1.
  for (int j = 1; j < 1 + kCodedBf16Window; ++j) in_window += count[j];
  for (int c0 = 1; c0 + kCodedBf16Window <= 128; ++c0) {
    if (c0 > 1) in_window += count[c0 + kCodedBf16Window - 1] - count[c0 - 1];
    if (in_window > best_count) best_count = in_window, best = c0;
  }
  RowTable t;
  t.first = best;
  t.escapes = K - count[0] - best_count;
  t.table[0] = 0x00;
  t.table[1] = 0x80;
  for (int j = 0; j < kCodedBf16Window; ++j) {
    t.table[2 + j] = static_cast<uint8_t>(best + j);
    t.table[2 + kCodedBf16Window + j] = static_cast<uint8_t>(0x80 | (best + j));
  }
  return t;
}

float bf16_bits_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Where one row's escapes go.
struct Escapes {
  int32_t* columns;
  float* values;
};

// One row into its coded blocks (the body row zeroed), the portable way.
void encode_row_scalar(const uint16_t* row, int64_t K, const Table& table, uint8_t* out, Escapes esc) {
  std::array<int8_t, 256> code;
  code.fill(-1);
  for (int j = 0; j < kCodedBf16TableSize; ++j) code[table[j]] = static_cast<int8_t>(j);
  int64_t e = 0;
  for (int64_t b = 0; b < K / kCodedBf16Block; ++b) {
    uint8_t* codes = out + b * kCodedBf16BlockBytes;
    uint8_t* low = codes + 32;
    for (int i = 0; i < kCodedBf16Block; ++i) {
      const int64_t k = b * kCodedBf16Block + i;
      const uint16_t v = row[k];
      int c = code[v >> 8];
      uint8_t lo = static_cast<uint8_t>(v & 0xff);
      if (c < 0) {  // an escape: +0 in the body, the value in the list
        c = 0;
        lo = 0;
        esc.columns[e] = static_cast<int32_t>(k);
        esc.values[e] = bf16_bits_to_f32(v);
        ++e;
      }
      const int p = coded_bf16_position(i);
      low[p] = lo;
      codes[p / 2] |= static_cast<uint8_t>(p % 2 == 0 ? c : c << 4);
    }
  }
}

#define TESSERA_TARGET_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))

// 32 weights' codes (a word each) and low bytes (escapes: code 0, low byte 0), and which
// are escapes, from the window's first high byte.
TESSERA_TARGET_AVX512BW inline void code_words(__m512i w, __m512i first, __m512i* codes, __m512i* low,
                                               __mmask32* escapes) {
  const __m512i high = _mm512_srli_epi16(w, 8);
  const __m512i magnitude = _mm512_and_si512(high, _mm512_set1_epi16(0x7f));
  const __m512i offset = _mm512_sub_epi16(magnitude, first);  // below the window: wraps high
  const __mmask32 in_window = _mm512_cmplt_epu16_mask(offset, _mm512_set1_epi16(kCodedBf16Window));
  const __mmask32 zero_class = _mm512_cmpeq_epi16_mask(magnitude, _mm512_setzero_si512());
  const __mmask32 negative = _mm512_test_epi16_mask(w, _mm512_set1_epi16(static_cast<int16_t>(0x8000)));
  __m512i code = _mm512_add_epi16(offset, _mm512_set1_epi16(2));
  code = _mm512_mask_add_epi16(code, negative, code, _mm512_set1_epi16(kCodedBf16Window));
  // High byte 0 or 0x80: codes 0 and 1, the sign bit itself.
  code = _mm512_mask_mov_epi16(_mm512_maskz_mov_epi16(in_window, code), zero_class, _mm512_srli_epi16(high, 7));
  *escapes = static_cast<__mmask32>(~(in_window | zero_class));
  *codes = code;
  *low = _mm512_maskz_and_epi32(0xffff, _mm512_maskz_mov_epi16(static_cast<__mmask32>(~*escapes), w),
                                _mm512_set1_epi16(0xff));
}

// The same as encode_row_scalar with AVX-512 BW: a block's low bytes and codes put in their
// byte positions by packus (the inverse of the decoder's unpacks).
TESSERA_TARGET_AVX512BW void encode_row_avx512(const uint16_t* row, int64_t K, int first_high, uint8_t* out,
                                               Escapes esc) {
  const __m512i first = _mm512_set1_epi16(static_cast<int16_t>(first_high));
  int64_t e = 0;
  for (int64_t b = 0; b < K / kCodedBf16Block; ++b) {
    const uint16_t* src = row + b * kCodedBf16Block;
    __m512i code0, code1, low0, low1;
    __mmask32 esc0, esc1;
    code_words(_mm512_loadu_si512(src), first, &code0, &low0, &esc0);
    code_words(_mm512_loadu_si512(src + 32), first, &code1, &low1, &esc1);
    const __m512i codes = _mm512_packus_epi16(code0, code1);
    // Two codes per byte: byte i holds position 2i in its low nibble, 2i + 1 in its high one.
    const __m512i pairs = _mm512_or_si512(_mm512_and_si512(codes, _mm512_set1_epi16(0x000f)),
                                          _mm512_and_si512(_mm512_srli_epi16(codes, 4), _mm512_set1_epi16(0x00f0)));
    uint8_t* block = out + b * kCodedBf16BlockBytes;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block), _mm512_cvtepi16_epi8(pairs));
    _mm512_storeu_si512(block + 32, _mm512_packus_epi16(low0, low1));
    for (const auto& [mask, base] : {std::pair<uint32_t, int64_t>{esc0, 0}, std::pair<uint32_t, int64_t>{esc1, 32}}) {
      for (uint32_t m = mask; m != 0; m &= m - 1) {
        const int64_t k = b * kCodedBf16Block + base + __builtin_ctz(m);
        esc.columns[e] = static_cast<int32_t>(k);
        esc.values[e] = bf16_bits_to_f32(row[k]);
        ++e;
      }
    }
  }
}

bool cpu_has_avx512bw() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

}  // namespace

CodedBf16Matrix encode_coded_bf16(const uint16_t* w, int64_t N, int64_t K, TensorArena* arena) {
  return encode_coded_bf16_with(w, N, K, arena, /*simd=*/true);
}

CodedBf16Matrix encode_coded_bf16_with(const uint16_t* w, int64_t N, int64_t K, TensorArena* arena, bool simd_asked) {
  TESSERA_CHECK(coded_bf16_codable(K)) << "coded bf16: the input width " << K << " is not a multiple of "
                                       << kCodedBf16Block;
  const int64_t row_bytes = coded_bf16_row_bytes(K);
  CodedBf16Matrix m;
  m.body = arena != nullptr ? arena->zeros({N, row_bytes}, DType::kU8) : Tensor::zeros({N, row_bytes}, DType::kU8);
  // Tables and escape counts first (the side tensor's size), then the codes.
  std::vector<RowTable> tables(static_cast<size_t>(N));
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t n = 0; n < N; ++n) tables[n] = row_table(w + n * K, K);
  std::vector<int64_t> escapes(static_cast<size_t>(N) + 1, 0);
  for (int64_t n = 0; n < N; ++n) escapes[n + 1] = escapes[n] + tables[n].escapes;
  const int64_t E = escapes[N];
  m.side = Tensor::zeros({CodedBf16Side::elements(N, E)}, DType::kI32);
  const CodedBf16Side layout = CodedBf16Side::of(N, m.side.numel());
  int32_t* side = m.side.data<int32_t>();
  auto* body = m.body.data<uint8_t>();
  auto* table_bytes = reinterpret_cast<uint8_t*>(side + layout.tables());
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(table_bytes + n * kCodedBf16TableSize, tables[n].table.data(), kCodedBf16TableSize);
    side[layout.row_start() + n] = static_cast<int32_t>(escapes[n]);
  }
  side[layout.row_start() + N] = static_cast<int32_t>(E);
  int32_t* columns = side + layout.columns();
  auto* values = reinterpret_cast<float*>(side + layout.values());
  const bool simd = simd_asked && cpu_has_avx512bw();
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t n = 0; n < N; ++n) {
    const Escapes esc{columns + escapes[n], values + escapes[n]};
    if (simd) {
      encode_row_avx512(w + n * K, K, tables[n].first, body + n * row_bytes, esc);
    } else {
      encode_row_scalar(w + n * K, K, tables[n].table, body + n * row_bytes, esc);
    }
  }
  return m;
}

void decode_coded_bf16_rows(const uint8_t* body, const int32_t* side, int64_t N, int64_t side_elements, int64_t K,
                            int64_t n0, int64_t n1, int64_t k0, int64_t k1, uint16_t* out) {
  const CodedBf16Side layout = CodedBf16Side::of(N, side_elements);
  const auto* tables = reinterpret_cast<const uint8_t*>(side + layout.tables());
  const int64_t row_bytes = coded_bf16_row_bytes(K), width = k1 - k0;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* table = tables + n * kCodedBf16TableSize;
    uint16_t* dst = out + (n - n0) * width;
    for (int64_t b = k0 / kCodedBf16Block; b < k1 / kCodedBf16Block; ++b) {
      const uint8_t* codes = body + n * row_bytes + b * kCodedBf16BlockBytes;
      for (int i = 0; i < kCodedBf16Block; ++i) {
        const int p = coded_bf16_position(i);
        const int c = p % 2 == 0 ? codes[p / 2] & 0x0f : codes[p / 2] >> 4;
        dst[b * kCodedBf16Block + i - k0] = static_cast<uint16_t>(table[c] << 8 | codes[32 + p]);
      }
    }
  }
  patch_coded_bf16_escapes(side, N, side_elements, n0, n1, k0, k1, out);
}

void patch_coded_bf16_escapes(const int32_t* side, int64_t N, int64_t side_elements, int64_t n0, int64_t n1,
                              int64_t k0, int64_t k1, uint16_t* out) {
  const CodedBf16Side layout = CodedBf16Side::of(N, side_elements);
  for (int64_t n = n0; n < n1; ++n) {
    for (int32_t e = side[layout.row_start() + n]; e < side[layout.row_start() + n + 1]; ++e) {
      const int64_t k = side[layout.columns() + e];
      if (k < k0 || k >= k1) continue;
      uint32_t bits;
      std::memcpy(&bits, side + layout.values() + e, sizeof bits);
      out[(n - n0) * (k1 - k0) + (k - k0)] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

}  // namespace tessera
