// The prefill regime of the CPU linear layer: compute bound, so the multiply is OpenBLAS
// sgemm. f16/bf16 weights are widened to f32 a panel of rows at a time (a panel's widening
// costs ~1 cycle per weight against 2*M flops per weight in the sgemm, so it is noise for
// the M this path sees) instead of materialising the whole f32 matrix.
//
// Threading policy. Debian's libopenblas0 is the pthreads build: its thread pool knows
// nothing of OpenMP's, and both busy-wait for a while after finishing work, so on a machine
// with as many threads as cores, alternating OpenMP regions and multi-threaded sgemm calls
// makes each pool's spinners steal cores from the other. Two policies are implemented and
// measured by bench/linear_bench.cc (BM_GemmThreading; figures in docs/performance-cpu.md, "CPU linear layer"):
//  - kOmpPanels (default): OpenBLAS is pinned to one thread; the output columns are split
//    across OpenMP threads and each thread widens and sgemms its own panels. One pool only.
//  - kBlasThreads: OpenMP widens a panel, then one sgemm over it threaded by OpenBLAS
//    (openblas_set_num_threads(omp_get_max_threads())).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/cpu/linear_kernels.h"

namespace tessera::cpu::detail {
namespace {

// openblas_set_num_threads is only called when the wanted count changes.
void set_blas_threads(int threads) {
  static std::atomic<int> current{-1};
  if (current.exchange(threads) != threads) openblas_set_num_threads(threads);
}

void widen(CpuIsa isa, const uint16_t* src, DType dtype, float* dst, int64_t n) {
  switch (isa) {
    case CpuIsa::kAvx512: widen_avx512(src, dtype, dst, n); break;
    case CpuIsa::kAvx2: widen_avx2(src, dtype, dst, n); break;
    case CpuIsa::kScalar: widen_scalar(src, dtype, dst, n); break;
  }
}

// Rows per widened panel: ~2 MiB of f32 (so it stays in L2/L3 between widening and sgemm),
// at least 64 rows so sgemm has a wide enough N, a multiple of 16.
int64_t panel_rows(int64_t K) {
  const int64_t rows = (int64_t{2} << 20) / (4 * std::max<int64_t>(K, 1));
  return std::clamp<int64_t>(rows / 16 * 16, 64, 1024);
}

// A reusable per-thread buffer (fresh large allocations would page-fault on every call).
float* panel_buffer(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

void sgemm_rows(const LinearArgs& a, const float* w_f32, int64_t n0, int64_t rows) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.M),
              static_cast<int>(rows), static_cast<int>(a.K), 1.0f, a.x, static_cast<int>(a.ldx),
              w_f32, static_cast<int>(a.K), 0.0f, a.y + n0, static_cast<int>(a.ldy));
}

// Output columns [n0, n1) on the calling thread alone.
void gemm_columns_serial(CpuIsa isa, const LinearArgs& a, int64_t n0, int64_t n1) {
  if (a.w_dtype == DType::kF32) {
    sgemm_rows(a, static_cast<const float*>(a.w) + n0 * a.K, n0, n1 - n0);
    return;
  }
  const int64_t panel = panel_rows(a.K);
  float* buffer = panel_buffer(std::min(panel, n1 - n0) * a.K);
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  for (int64_t p = n0; p < n1; p += panel) {
    const int64_t rows = std::min(panel, n1 - p);
    widen(isa, w + p * a.K, a.w_dtype, buffer, rows * a.K);
    sgemm_rows(a, buffer, p, rows);
  }
}

void gemm_omp_panels(CpuIsa isa, const LinearArgs& a) {
  set_blas_threads(1);
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t tid = omp_get_thread_num();
    const int64_t per_thread = ((a.N + nt - 1) / nt + 15) / 16 * 16;
    const int64_t n0 = std::min(a.N, tid * per_thread);
    const int64_t n1 = std::min(a.N, n0 + per_thread);
    if (n0 < n1) gemm_columns_serial(isa, a, n0, n1);
  }
}

void gemm_blas_threads(CpuIsa isa, const LinearArgs& a) {
  set_blas_threads(omp_get_max_threads());
  if (a.w_dtype == DType::kF32) {
    sgemm_rows(a, static_cast<const float*>(a.w), 0, a.N);
    return;
  }
  const int64_t panel = panel_rows(a.K);
  float* buffer = panel_buffer(std::min(panel, a.N) * a.K);
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  for (int64_t p = 0; p < a.N; p += panel) {
    const int64_t rows = std::min(panel, a.N - p);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      widen(isa, w + (p + r) * a.K, a.w_dtype, buffer + r * a.K, a.K);
    }
    sgemm_rows(a, buffer, p, rows);
  }
}

void bias_act_epilogue(const LinearArgs& a) {
  if (a.bias == nullptr && a.act == Activation::kNone) return;
#pragma omp parallel for schedule(static) if (a.M * a.N >= 16 * 1024)
  for (int64_t m = 0; m < a.M; ++m) {
    float* row = a.y + m * a.ldy;
    for (int64_t n = 0; n < a.N; ++n) row[n] = finish_output(row[n], a.bias, n, a.act);
  }
}

}  // namespace

void gemm_linear(const LinearOptions& options, const LinearArgs& a) {
  if (options.threading == GemmThreading::kBlasThreads) {
    gemm_blas_threads(options.isa, a);
  } else {
    gemm_omp_panels(options.isa, a);
  }
  bias_act_epilogue(a);
}

}  // namespace tessera::cpu::detail
