// The coded bf16 linear layer (linear_coded_bf16.h): the AVX-512 BF16 GEMV over the coded
// blocks, the block decoders the packed GEMM packs from, the decode-a-chunk-then-bf16 path,
// and the choice between them.
#include "kernels/cpu/linear_coded_bf16.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/coded_bf16.h"
#include "kernels/cpu/decode_chunks.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/linear_kernels.h"

// GCC 12 sees the intrinsics' undefined-register idiom (_mm512_undefined_*) as uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TESSERA_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define TESSERA_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace tessera::cpu {
namespace {

// One coded matrix as the kernels read it.
struct Coded {
  const uint8_t* body;
  const int32_t* side;
  CodedBf16Side layout;
  int64_t K, row_bytes;
  const uint8_t* table(int64_t n) const {
    return reinterpret_cast<const uint8_t*>(side + layout.tables()) + n * kCodedBf16TableSize;
  }
  int32_t escapes_begin(int64_t n) const { return side[layout.row_start() + n]; }
  int32_t escape_column(int32_t e) const { return side[layout.columns() + e]; }
  float escape_value(int32_t e) const {
    float v;
    std::memcpy(&v, side + layout.values() + e, sizeof v);
    return v;
  }
};

// One 64-input block to 32 + 32 bf16 in input order: the codes widened to a byte each (low
// nibble at the even byte, high at the odd one, as coded_bf16_position expects), looked up
// in the row's table (the high bytes), interleaved with the low bytes.
TESSERA_TARGET_AVX512 inline __attribute__((always_inline)) void decode_block(const uint8_t* block, __m512i table,
                                                                               __m512i* first, __m512i* second) {
  const __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
  // (wide | wide << 4) & 0x0f0f: byte 2i the low nibble of code byte i, byte 2i + 1 its high one.
  const __m512i index = _mm512_ternarylogic_epi32(wide, _mm512_slli_epi16(wide, 4), _mm512_set1_epi16(0x0f0f), 0xa8);
  const __m512i high = _mm512_shuffle_epi8(table, index);
  const __m512i low = _mm512_loadu_si512(block + 32);
  *first = _mm512_unpacklo_epi8(low, high);
  *second = _mm512_unpackhi_epi8(low, high);
}

// Row n's table of high bytes in every 16-byte lane (vpshufb looks up within lanes).
TESSERA_TARGET_AVX512 inline __m512i broadcast_table(const Coded& c, int64_t n) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.table(n))));
}

// Whether a tile prefetches the weight rows after its own: as gemv_bf16_dot, from two rows
// of x on (with one, the hardware prefetchers keep up with a single stream).
template <int MT>
inline constexpr bool kPrefetchNextRows = MT >= 2;

// MT rows of bf16 x (rows K apart) against weight rows [n0, n1), R at a time: each block of
// a weight row decoded once and multiplied into every row of x. Each (x row, weight row) has
// one accumulator that takes the 64 inputs of a block in order, so a row of x sums in the
// same order whatever MT and R are (its logits do not depend on the rest of its batch).
template <int MT, int R>
TESSERA_TARGET_AVX512_BF16 void tile(const Coded& c, const uint16_t* xb, int64_t m0, int64_t n0, int64_t n1,
                                     const float* bias, float* y, int64_t ldy, Activation act) {
  const int64_t K = c.K;
  for (int64_t n = n0; n < n1; n += R) {
    __m512i table[R];
    const uint8_t* block[R];
    const uint8_t* next[R];  // the rows R after these, prefetched alongside
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int64_t row = std::min(n + r, n1 - 1);
      table[r] = broadcast_table(c, row);
      block[r] = c.body + row * c.row_bytes;
      next[r] = c.body + std::min(n + R + r, n1 - 1) * c.row_bytes;
    }
    __m512 acc[MT][R];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0, at = 0; k < K; k += kCodedBf16Block, at += kCodedBf16BlockBytes) {
      __m512i first[R], second[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if constexpr (kPrefetchNextRows<MT>) {
          __builtin_prefetch(next[r] + at, 0, 3);
          __builtin_prefetch(next[r] + at + 64, 0, 3);
        }
        decode_block(block[r] + at, table[r], &first[r], &second[r]);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const uint16_t* xr = xb + (m0 + i) * K + k;
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xr), x1 = (__m512bh)_mm512_loadu_si512(xr + 32);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          acc[i][r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[i][r], x0, (__m512bh)first[r]), x1, (__m512bh)second[r]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      if (n + r >= n1) break;
      const int32_t e0 = c.escapes_begin(n + r), e1 = c.escapes_begin(n + r + 1);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        float sum = _mm512_reduce_add_ps(acc[i][r]);
        const uint16_t* xr = xb + (m0 + i) * K;
        for (int32_t e = e0; e < e1; ++e) sum += c.escape_value(e) * bf16_to_f32(xr[c.escape_column(e)]);
        y[(m0 + i) * ldy + n + r] = detail::finish_output(sum, bias, n + r, act);
      }
    }
  }
}

// Rows [n0, n1) for every row of x: tiles of up to 8 rows of x; a group of 16 weight rows
// (~48 KiB at K = 2048) stays in L2 for a second tile.
TESSERA_TARGET_AVX512_BF16 void gemv_rows(const Coded& c, const uint16_t* xb, int64_t M, int64_t n0, int64_t n1,
                                          const float* bias, float* y, int64_t ldy, Activation act) {
  constexpr int64_t kGroup = 16;
  for (int64_t g = n0; g < n1; g += kGroup) {
    const int64_t g1 = std::min(n1, g + kGroup);
    for (int64_t m = 0; m < M; m += 8) {
      switch (std::min<int64_t>(8, M - m)) {
        case 1: tile<1, 1>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 2: tile<2, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 3: tile<3, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 4: tile<4, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 5: tile<5, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 6: tile<6, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 7: tile<7, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        default: tile<8, 2>(c, xb, m, g, g1, bias, y, ldy, act); break;
      }
    }
  }
}

void coded_gemv(const Coded& c, const float* x, int64_t M, int64_t ldx, int64_t N, const float* bias, float* y,
                int64_t ldy, Activation act) {
  const int64_t K = c.K;
  thread_local std::vector<uint16_t> x_buffer;
  uint16_t* xb = detail::scratch(x_buffer, M * K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xb[m * K + k] = f32_to_bf16(x[m * ldx + k]);
  }
  const detail::DecodeChunks chunks(N, c.row_bytes, 16, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 1) if (chunks.count() > 1 && M * N * K >= 32 * 1024)
  for (int64_t ch = 0; ch < chunks.count(); ++ch) gemv_rows(c, xb, M, chunks.begin(ch), chunks.begin(ch + 1), bias, y, ldy, act);
}

// Rows [n0, n0 + rows), inputs [k0, k0 + kc) back to bf16 (out rows kc apart), escapes as +0.
TESSERA_TARGET_AVX512 void decode_block_avx512(const Coded& c, int64_t n0, int64_t rows, int64_t k0, int64_t kc,
                                               uint16_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = n0 + r;
    const __m512i table = broadcast_table(c, n);
    const uint8_t* block = c.body + n * c.row_bytes + coded_bf16_row_bytes(k0);
    for (int64_t k = 0; k < kc; k += kCodedBf16Block, block += kCodedBf16BlockBytes) {
      __m512i first, second;
      decode_block(block, table, &first, &second);
      _mm512_storeu_si512(out + r * kc + k, first);
      _mm512_storeu_si512(out + r * kc + k + 32, second);
    }
  }
}

// Chunks of about this many bytes of decoded rows: big enough that the packed GEMM keeps
// its blocking, small enough to stay out of the way of the model's memory.
constexpr int64_t kDecodedChunkBytes = int64_t{4} << 20;

void decoded_chunks(const detail::LinearOptions& options, const Coded& c, const float* x, int64_t M, int64_t ldx,
                    int64_t N, const float* bias, float* y, int64_t ldy, Activation act) {
  const int64_t K = c.K;
  const int64_t chunk = std::max<int64_t>(32, kDecodedChunkBytes / (2 * K) / 32 * 32);
  thread_local std::vector<uint16_t> decoded;
  uint16_t* w = detail::scratch(decoded, std::min(chunk, N) * K);
  detail::WeightSource source{c.body, DType::kU8, N, K};
  source.coded_side = c.side;
  source.coded_side_elements = CodedBf16Side::elements(N, c.layout.escapes);
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t n1 = std::min(N, n0 + chunk);
#pragma omp parallel for schedule(static) if (n1 - n0 >= 64)
    for (int64_t r = n0; r < n1; r += 16) {
      detail::decode_coded_bf16_block(options.isa, source, r, std::min(n1, r + 16) - r, 0, K, w + (r - n0) * K);
    }
    detail::linear_with(options, x, M, K, ldx, w, DType::kBF16, n1 - n0, bias != nullptr ? bias + n0 : nullptr, y + n0,
                        ldy, act);
  }
}

}  // namespace

namespace detail {

bool coded_bf16_gemv_runs(const LinearOptions& options, int64_t M) {
  return M <= kBf16DotGemvMaxRows && options.bf16_dot && std::min(options.isa, detected_cpu_isa()) == CpuIsa::kAvx512 &&
         cpu_has_bf16_dot() && options.path != LinearPath::kGemm;
}

void decode_coded_bf16_block(CpuIsa isa, const WeightSource& source, int64_t n0, int64_t rows, int64_t k0, int64_t kc,
                             uint16_t* out) {
  const Coded c{static_cast<const uint8_t*>(source.w), source.coded_side,
                CodedBf16Side::of(source.N, source.coded_side_elements), source.K, coded_bf16_row_bytes(source.K)};
  if (isa == CpuIsa::kAvx512) {
    decode_block_avx512(c, n0, rows, k0, kc, out);
    patch_coded_bf16_escapes(source.coded_side, source.N, source.coded_side_elements, n0, n0 + rows, k0, k0 + kc, out);
  } else {
    decode_coded_bf16_rows(c.body, source.coded_side, source.N, source.coded_side_elements, source.K, n0, n0 + rows, k0,
                           k0 + kc, out);
  }
}

}  // namespace detail

void linear_coded_bf16(const detail::LinearOptions& options, const float* x, int64_t M, int64_t K, int64_t ldx,
                       const uint8_t* body, const int32_t* side, int64_t side_elements, int64_t N, const float* bias,
                       float* y, int64_t ldy, Activation act) {
  TESSERA_CHECK(coded_bf16_codable(K)) << "coded bf16: K=" << K;
  TESSERA_CHECK_GE(ldx, K);
  TESSERA_CHECK_GE(ldy, N);
  if (M == 0 || N == 0) return;
  const Coded c{body, side, CodedBf16Side::of(N, side_elements), K, coded_bf16_row_bytes(K)};
  detail::LinearOptions clamped = options;
  clamped.isa = std::min(options.isa, detected_cpu_isa());
  if (detail::coded_bf16_gemv_runs(clamped, M)) {
    coded_gemv(c, x, M, ldx, N, bias, y, ldy, act);
    return;
  }
  // Where the bf16 linear layer would run the packed GEMM, it runs on the coded matrix,
  // decoding each panel's K block as it packs it; elsewhere whole chunks of rows are decoded.
  const bool packed = detail::gemm_packed_supported(clamped.isa) &&
                      (clamped.gemm == GemmKernel::kPacked ||
                       (clamped.gemm == GemmKernel::kAuto &&
                        detail::packed_gemm_preferred(clamped.isa, DType::kBF16, M, clamped.gemm_policy)));
  const bool gemv = clamped.path == detail::LinearPath::kGemv ||
                    (clamped.path == detail::LinearPath::kAuto &&
                     M <= gemv_rows_before_packed_gemm(clamped.isa, DType::kBF16, clamped.bf16_dot));
  if (packed && !gemv) {
    const detail::LinearArgs args{x, M, K, ldx, body, DType::kBF16, N, bias, y, ldy, act};
    detail::gemm_packed_coded_bf16(clamped.isa, args, side, side_elements, clamped.bf16_dot);
  } else {
    decoded_chunks(clamped, c, x, M, ldx, N, bias, y, ldy, act);
  }
}

}  // namespace tessera::cpu
