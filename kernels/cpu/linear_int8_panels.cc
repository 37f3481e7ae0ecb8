// The int8 linear layer on persistent panels (linear_int8_panels.h): the load-time packing,
// the regime by M with its threading, and the panel GEMV. The GEMM is gemm_int8_vnni.cc's,
// reading the panels in place.
#include "kernels/cpu/linear_int8_panels.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/decode_chunks.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_kernels.h"
#include "kernels/cpu/vnni_asm.h"

// GCC 12 warns inside its own intrinsics (_mm512_undefined_* is "maybe uninitialized" by
// design), as in the other kernel files.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TESSERA_TARGET_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

namespace tessera::cpu {

void pack_int8_panels(const int8_t* q, const float* scales, int64_t N, int64_t K, int64_t group, int8_t* wp,
                      float* sp) {
  TESSERA_CHECK(group > 0 && K % group == 0 && K % 2 == 0) << "K=" << K << " group=" << group;
  const int64_t panels = int8_panel_count(N), groups = K / group, steps = K / 2;
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 20))
  for (int64_t p = 0; p < panels; ++p) {
    int8_t* dst = wp + p * K * kInt8PanelColumns;
    float* sdst = sp + p * groups * kInt8PanelColumns;
    for (int64_t c = 0; c < kInt8PanelColumns; ++c) {
      const int64_t n = p * kInt8PanelColumns + c;
      const int8_t* row = n < N ? q + n * K : nullptr;
      for (int64_t s = 0; s < steps; ++s) {
        dst[(s * kInt8PanelColumns + c) * 2] = row ? row[2 * s] : 0;
        dst[(s * kInt8PanelColumns + c) * 2 + 1] = row ? row[2 * s + 1] : 0;
      }
      for (int64_t g = 0; g < groups; ++g) sdst[g * kInt8PanelColumns + c] = row ? scales[n * groups + g] : 0.0f;
    }
  }
}

bool int8_panels_preferred(const CpuKernelOptions& options) {
  const detail::Int8LinearOptions int8 = detail::int8_linear_options(options);
  return int8.isa == CpuIsa::kAvx512 && detail::int8_gemm_uses_int16_x(int8) && !int8.int8_activations;
}

namespace detail {
namespace {

// MT rows of x against panels [p0, p1), PP panels at a time (independent accumulator chains
// for the one- and two-row tiles, whose single chain per panel would wait on vpdpwssd's
// latency). Per 64-byte step: two widenings and 2 x MT x PP products; per group and 16
// columns one conversion and one scale (weight scales x the row's x scale).
template <int MT, int PP>
TESSERA_TARGET_AVX512_VNNI void panel_tile(const Int16XArgs& d, int64_t m0, int64_t p0, int64_t p1) {
  const Int8LinearArgs& a = *d.a;
  const int64_t K = a.K, G = a.group, groups = K / G;
  for (int64_t p = p0; p < p1; p += PP) {
    const int live = static_cast<int>(std::min<int64_t>(PP, p1 - p));
    const int8_t* wp[PP];
    const float* sp[PP];
    for (int j = 0; j < PP; ++j) {
      const int64_t pj = p + std::min(j, live - 1);  // a missing panel repeats the last (not stored)
      wp[j] = a.w + pj * K * kInt8PanelColumns;
      sp[j] = a.scales + pj * groups * kInt8PanelColumns;
    }
    __m512 total[MT][PP][2];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < PP; ++j) total[i][j][0] = total[i][j][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i acc[MT][PP][2];
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < PP; ++j) acc[i][j][0] = acc[i][j][1] = _mm512_setzero_si512();
      for (int64_t s = g * G / 2; s < (g + 1) * G / 2; ++s) {
        __m512i w[PP][2];
#pragma GCC unroll 4
        for (int j = 0; j < PP; ++j) {
          w[j][0] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[j] + s * 64)));
          w[j][1] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[j] + s * 64 + 32)));
        }
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          int32_t pair;
          std::memcpy(&pair, d.xq + (m0 + i) * K + 2 * s, sizeof(pair));
          const __m512i xv = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
          for (int j = 0; j < PP; ++j) {
            acc[i][j][0] = dpwssd(acc[i][j][0], xv, w[j][0]);
            acc[i][j][1] = dpwssd(acc[i][j][1], xv, w[j][1]);
          }
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < PP; ++j) {
        const __m512 s0 = _mm512_loadu_ps(sp[j] + g * kInt8PanelColumns);
        const __m512 s1 = _mm512_loadu_ps(sp[j] + g * kInt8PanelColumns + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const __m512 sx = _mm512_set1_ps(d.xs[(m0 + i) * groups + g]);
          total[i][j][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j][0]), _mm512_mul_ps(s0, sx), total[i][j][0]);
          total[i][j][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j][1]), _mm512_mul_ps(s1, sx), total[i][j][1]);
        }
      }
    }
    for (int j = 0; j < live; ++j) {
      const int64_t n0 = (p + j) * kInt8PanelColumns, cols = std::min<int64_t>(kInt8PanelColumns, a.N - n0);
      for (int i = 0; i < MT; ++i) {
        alignas(64) float out[kInt8PanelColumns];
        _mm512_store_ps(out, total[i][j][0]);
        _mm512_store_ps(out + 16, total[i][j][1]);
        float* y = a.y + (m0 + i) * a.ldy + n0;
        for (int64_t c = 0; c < cols; ++c) y[c] = finish_output(out[c], a.bias, n0 + c, a.act);
      }
    }
  }
}

}  // namespace

void gemv_int8_panels_avx512_vnni(const Int16XArgs& d, int64_t p0, int64_t p1) {
  int64_t m = 0;
  for (; m + 4 <= d.a->M; m += 4) panel_tile<4, 1>(d, m, p0, p1);
  for (; m + 2 <= d.a->M; m += 2) panel_tile<2, 2>(d, m, p0, p1);
  for (; m < d.a->M; ++m) panel_tile<1, 4>(d, m, p0, p1);
}

namespace {

// x rows in 16-bit fixed point, then the panels in chunks taken dynamically by the threads
// (decode_chunks.h), as the row-major GEMV takes rows.
void gemv(const Int8LinearArgs& a) {
  const Int16XArgs d = quantize_x_int16(CpuIsa::kAvx512, a);
  const int64_t panels = int8_panel_count(a.N);
  const int threads = omp_get_max_threads();
  if (threads == 1 || panels < 2 || a.M * a.N * a.K < 32 * 1024) {
    gemv_int8_panels_avx512_vnni(d, 0, panels);
    return;
  }
  const DecodeChunks chunks(panels, (a.K + 4 * (a.K / a.group)) * kInt8PanelColumns, 1, threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks.count(); ++c) gemv_int8_panels_avx512_vnni(d, chunks.begin(c), chunks.begin(c + 1));
}

}  // namespace

// 4096 x 4096, forced each way (bench/linear_int8_bench.cc): the GEMV 0.35-0.54 ms at 2-4
// rows where the GEMM takes 0.85-0.88 (it computes whole 8-row tiles); 0.76 / 0.91 at 8,
// 1.02 / 1.12 at 12; from 16 rows the GEMM wins (1.15 / 1.27).
int64_t int8_panel_gemv_max_rows() { return 12; }

void linear_int8_panels_with(LinearPath path, const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* wp,
                             const float* sp, int64_t group, int64_t N, const float* bias, float* y, int64_t ldy,
                             Activation act) {
  TESSERA_CHECK(cpu_has_avx512_vnni()) << "int8 panels need AVX-512 VNNI (int8_panels_preferred decides the layout)";
  TESSERA_CHECK(group % 32 == 0 && group > 0 && K % group == 0) << "K=" << K << " group=" << group;
  if (M == 0 || N == 0) return;
  const Int8LinearArgs a{x, M, K, ldx, wp, sp, group, N, bias, y, ldy, act};
  const bool use_gemv = path == LinearPath::kGemv || (path == LinearPath::kAuto && M <= int8_panel_gemv_max_rows());
  if (use_gemv) {
    gemv(a);
  } else {
    gemm_int8_panels_avx512_vnni(a);
  }
}

}  // namespace detail

void linear_int8_panels(const float* x, int64_t M, int64_t K, int64_t ldx, const int8_t* wp, const float* sp,
                        int64_t group, int64_t N, const float* bias, float* y, int64_t ldy, Activation act) {
  detail::linear_int8_panels_with(detail::LinearPath::kAuto, x, M, K, ldx, wp, sp, group, N, bias, y, ldy, act);
}

}  // namespace tessera::cpu
