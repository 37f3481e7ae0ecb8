// bf16 weights times bf16-rounded x for a few rows of x (decode, 1 to
// kBf16DotGemvMaxRows rows), on AVX-512 BF16: each weight row is read once, in place, and
// every 64-byte load of it feeds one vdpbf16ps (32 products) per row of x. The packed GEMM
// does the same arithmetic but first repacks W into column panels, which at these few rows
// cost more than the products (perf, batch-8 decode of the ~100M model: packing 26% of the
// step, the micro-kernel 11%). The registers hold 8 x rows x 2 weight rows of accumulators, so
// only 2 weight rows stream at a time; the rows 2 pairs ahead are prefetched alongside, which
// measured 1.14x on batch-8 decode against no prefetch (not at batch 1: kPrefetchNextRows).
//
// One row of x (batch-1 decode) has no weight reuse to share, so it reads the rows one after
// another (tile<1, 1>): each thread's chunk is then one sequential stream, and the row's
// single accumulator sums in the order every tile does, so a sequence's logits do not depend
// on what else is in its batch. Against 4 rows side by side (tile<1, 4>), batch-1 decode on the 2-core AMD EPYC host of docs/benchmarks.md
// (tessera-bench, ABBA rounds, 2026-12-07): ~1.1B bf16 1.01-1.22x, ~100M bf16 1.17-1.59x.
// linear_bench's one-matrix loops disagree on rows of 4 KB and more (0.78-1.03x); the
// model's step, every matrix once, is what decode runs.
//
// Same rounding as the packed GEMM's bf16 dot kernel (x by f32_to_bf16, products exact,
// sums f32); a different summation order (each 64-byte step's 32 products land in 16 lanes,
// reduced across lanes at the end), so results agree with it to f32 summation error.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/decode_chunks.h"
#include "kernels/cpu/linear_kernels.h"

#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TESSERA_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace tessera::cpu::detail {
namespace {

// One 32-k step: R weight vectors, each multiplied into MT rows of x.
template <int MT, int R, bool kMasked>
TESSERA_TARGET_AVX512_BF16 inline __attribute__((always_inline)) void step(const uint16_t* const* row, const uint16_t* x,
                                                                           int64_t kp, int64_t k, __mmask32 tail,
                                                                           __m512 (*acc)[R]) {
  __m512bh wv[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    wv[r] = (__m512bh)(kMasked ? _mm512_maskz_loadu_epi16(tail, row[r] + k) : _mm512_loadu_si512(row[r] + k));
  }
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * kp + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv, wv[r]);
  }
}

// Whether a tile prefetches the weight rows after its own. From two rows of x on it pays
// (~1.1B bf16 decode, batch 2: 34-36 against 29-34 tok/s without; batch 8: 83-90 against
// 62-71). With one row the hardware prefetchers keep up with the loop on huge pages, and the
// prefetches only take load slots: ~100M bf16 batch-1 decode 174-200 tok/s without against
// 154-171 with, six interleaved pairs; ~1.1B the same within noise (tessera-bench, 2026-12-06).
template <int MT>
inline constexpr bool kPrefetchNextRows = MT >= 2;

// MT rows of bf16 x (rows kp apart, zero padded to kp, a multiple of 32) against weight rows
// [n0, n1), R at a time; K tails load masked (zeros), matching the zero padding of x.
template <int MT, int R>
TESSERA_TARGET_AVX512_BF16 void tile(const LinearArgs& a, const uint16_t* xb, int64_t kp, int64_t m0, int64_t n0,
                                     int64_t n1) {
  const int64_t K = a.K;
  const int64_t k_main = K & ~int64_t{31};
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (K - k_main)) - 1u);
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  for (int64_t n = n0; n < n1; n += R) {
    const uint16_t* row[R];
    for (int r = 0; r < R; ++r) row[r] = w + std::min(n + r, n1 - 1) * K;
    __m512 acc[MT][R];
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
    }
    // The next R rows are fetched while these are summed: more DRAM streams in flight than
    // the R the registers allow.
    const uint16_t* next = w + std::min(n + 2 * R, n1 - 1) * K;
    for (int64_t k = 0; k < k_main; k += 32) {
      if constexpr (kPrefetchNextRows<MT>) {
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) __builtin_prefetch(next + r * K + k, 0, 3);
      }
      step<MT, R, false>(row, xb + m0 * kp, kp, k, 0, acc);
    }
    if (k_main < K) step<MT, R, true>(row, xb + m0 * kp, kp, k_main, tail, acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      if (n + r >= n1) break;
#pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        a.y[(m0 + i) * a.ldy + n + r] = finish_output(_mm512_reduce_add_ps(acc[i][r]), a.bias, n + r, a.act);
      }
    }
  }
}

// Rows [n0, n1) for every row of x: tiles of up to 8 rows of x, the weight rows of a group
// reused from L1 by the later tiles.
TESSERA_TARGET_AVX512_BF16 void rows(const LinearArgs& a, const uint16_t* xb, int64_t kp, int64_t n0, int64_t n1) {
  // Groups of 16 weight rows (24-64 KiB at K = 768-2048) stay in L1/L2 for the second tile.
  constexpr int64_t kGroup = 16;
  for (int64_t g = n0; g < n1; g += kGroup) {
    const int64_t g1 = std::min(n1, g + kGroup);
    for (int64_t m = 0; m < a.M; m += 8) {
      switch (std::min<int64_t>(8, a.M - m)) {
        case 1: tile<1, 1>(a, xb, kp, m, g, g1); break;  // one stream: see the top of the file
        case 2: tile<2, 4>(a, xb, kp, m, g, g1); break;
        case 3: tile<3, 4>(a, xb, kp, m, g, g1); break;
        case 4: tile<4, 4>(a, xb, kp, m, g, g1); break;
        case 5: tile<5, 2>(a, xb, kp, m, g, g1); break;
        case 6: tile<6, 2>(a, xb, kp, m, g, g1); break;
        case 7: tile<7, 2>(a, xb, kp, m, g, g1); break;
        default: tile<8, 2>(a, xb, kp, m, g, g1); break;
      }
    }
  }
}

}  // namespace

void gemv_bf16_dot(const LinearArgs& a) {
  // x rounded to bf16 once per call, rows padded with zeros to a multiple of 32.
  const int64_t kp = (a.K + 31) & ~int64_t{31};
  thread_local std::vector<uint16_t> x_buffer;
  uint16_t* xb = scratch(x_buffer, a.M * kp);
  for (int64_t m = 0; m < a.M; ++m) {
    const float* src = a.x + m * a.ldx;
    uint16_t* dst = xb + m * kp;
    for (int64_t k = 0; k < a.K; ++k) dst[k] = f32_to_bf16(src[k]);
    std::fill(dst + a.K, dst + kp, uint16_t{0});
  }
  // Weight rows in chunks taken dynamically, as every decode GEMV does (decode_chunks.h).
  const DecodeChunks chunks(a.N, a.K * 2, 16, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 1) if (chunks.count() > 1 && a.M * a.N * a.K >= 32 * 1024)
  for (int64_t c = 0; c < chunks.count(); ++c) rows(a, xb, kp, chunks.begin(c), chunks.begin(c + 1));
}

}  // namespace tessera::cpu::detail
