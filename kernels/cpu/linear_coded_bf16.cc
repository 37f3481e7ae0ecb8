// The coded bf16 linear layer (linear_coded_bf16.h): the AVX-512 BF16 GEMV over the coded
// blocks, and the decode-a-chunk-then-bf16 path for everything else.
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

TESSERA_TARGET_AVX512 inline __m512i row_table(const Coded& c, int64_t n) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.table(n))));
}

// MT rows of bf16 x (rows K apart) against weight rows [n0, n1): each block decoded once
// and multiplied into every row of x; each row of x sums in the same order whatever MT is.
template <int MT>
TESSERA_TARGET_AVX512_BF16 void tile(const Coded& c, const uint16_t* xb, int64_t m0, int64_t n0, int64_t n1,
                                     const float* bias, float* y, int64_t ldy, Activation act) {
  const int64_t K = c.K;
  for (int64_t n = n0; n < n1; ++n) {
    const __m512i table = row_table(c, n);
    const uint8_t* block = c.body + n * c.row_bytes;
    __m512 acc[MT][2];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += kCodedBf16Block, block += kCodedBf16BlockBytes) {
      __m512i first, second;
      decode_block(block, table, &first, &second);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const uint16_t* xr = xb + (m0 + i) * K + k;
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)_mm512_loadu_si512(xr), (__m512bh)first);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)_mm512_loadu_si512(xr + 32), (__m512bh)second);
      }
    }
    const int32_t e0 = c.escapes_begin(n), e1 = c.escapes_begin(n + 1);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
      const uint16_t* xr = xb + (m0 + i) * K;
      for (int32_t e = e0; e < e1; ++e) sum += c.escape_value(e) * bf16_to_f32(xr[c.escape_column(e)]);
      y[(m0 + i) * ldy + n] = detail::finish_output(sum, bias, n, act);
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
        case 1: tile<1>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 2: tile<2>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 3: tile<3>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 4: tile<4>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 5: tile<5>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 6: tile<6>(c, xb, m, g, g1, bias, y, ldy, act); break;
        case 7: tile<7>(c, xb, m, g, g1, bias, y, ldy, act); break;
        default: tile<8>(c, xb, m, g, g1, bias, y, ldy, act); break;
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

// Rows [n0, n1) back to bf16 (out rows K apart), escapes patched in.
TESSERA_TARGET_AVX512 void decode_rows_avx512(const Coded& c, int64_t n0, int64_t n1, uint16_t* out) {
  for (int64_t n = n0; n < n1; ++n) {
    const __m512i table = row_table(c, n);
    const uint8_t* block = c.body + n * c.row_bytes;
    uint16_t* dst = out + (n - n0) * c.K;
    for (int64_t k = 0; k < c.K; k += kCodedBf16Block, block += kCodedBf16BlockBytes) {
      __m512i first, second;
      decode_block(block, table, &first, &second);
      _mm512_storeu_si512(dst + k, first);
      _mm512_storeu_si512(dst + k + 32, second);
    }
    for (int32_t e = c.escapes_begin(n); e < c.escapes_begin(n + 1); ++e) {
      uint32_t bits;
      std::memcpy(&bits, c.side + c.layout.values() + e, sizeof bits);
      dst[c.escape_column(e)] = static_cast<uint16_t>(bits >> 16);
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
  const bool simd = options.isa == CpuIsa::kAvx512;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t n1 = std::min(N, n0 + chunk);
#pragma omp parallel for schedule(static) if (n1 - n0 >= 64)
    for (int64_t r = n0; r < n1; r += 16) {
      const int64_t r1 = std::min(n1, r + 16);
      if (simd) {
        decode_rows_avx512(c, r, r1, w + (r - n0) * K);
      } else {
        decode_coded_bf16_rows(c.body, c.side, c.layout.rows, CodedBf16Side::elements(c.layout.rows, c.layout.escapes),
                               K, r, r1, w + (r - n0) * K);
      }
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
  } else {
    decoded_chunks(clamped, c, x, M, ldx, N, bias, y, ldy, act);
  }
}

}  // namespace tessera::cpu
