// The 4-bit (and 6-bit) linear layer's front (linear_int4.h): checks, x quantized once per call, the ISA
// flavour, and threads over chunks of panels.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/decode_chunks.h"
#include "kernels/cpu/linear_int4_kernels.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_kernels.h"

namespace tessera::cpu {
namespace {

// x's rows per group of 32 as int8 (quantize_int8's rule), their scales, and the sums of
// each group and of each half group, in this thread's reused buffers.
struct QuantizedX {
  const int8_t* q;
  const float* s;
  const int32_t* sum;
  const int32_t* sum16;
};

QuantizedX quantize_x(CpuIsa isa, const float* x, int64_t M, int64_t K, int64_t ldx) {
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> xsum, xsum16;
  const int64_t groups = K / kInt4Group;
  int8_t* q = detail::scratch(xq, M * K);
  float* s = detail::scratch(xs, M * groups);
  int32_t* sum = detail::scratch(xsum, M * groups);
  int32_t* sum16 = detail::scratch(xsum16, M * 2 * groups);
#pragma omp parallel for schedule(static) if (M * K >= (int64_t{1} << 16))
  for (int64_t m = 0; m < M; ++m) {
    if (isa == CpuIsa::kAvx512) {
      detail::quantize_row_int8_avx512(x + m * ldx, K, kInt4Group, q + m * K, s + m * groups);
    } else {
      quantize_int8(x + m * ldx, DType::kF32, 1, K, kInt4Group, q + m * K, s + m * groups);
    }
    for (int64_t h = 0; h < 2 * groups; ++h) {
      int32_t total = 0;
      for (int64_t k = h * kSixBitGroup; k < (h + 1) * kSixBitGroup; ++k) total += q[m * K + k];
      sum16[m * 2 * groups + h] = total;
    }
    for (int64_t g = 0; g < groups; ++g) sum[m * groups + g] = sum16[m * 2 * groups + 2 * g] + sum16[m * 2 * groups + 2 * g + 1];
  }
  return {q, s, sum, sum16};
}

void run_panels(CpuIsa isa, const detail::Int4Args& a, int64_t p0, int64_t p1) {
  if (isa == CpuIsa::kAvx512 && detail::cpu_has_avx512_vnni()) {
    detail::int4_panels_avx512_vnni(a, p0, p1);
  } else if (isa >= CpuIsa::kAvx2) {
    detail::int4_panels_avx2(a, p0, p1);
  } else {
    detail::int4_panels_scalar(a, p0, p1);
  }
}

constexpr int64_t kMinParallelMacs = 32 * 1024;

}  // namespace

void linear_int4(const Int4LinearOptions& options, Int4Scheme scheme, const float* x, int64_t M, int64_t K,
                 int64_t ldx, const uint8_t* nibbles, const uint8_t* scales, int64_t N, const float* bias, float* y,
                 int64_t ldy, Activation act) {
  TESSERA_CHECK(M >= 0 && K >= 0 && N >= 0) << "M=" << M << " K=" << K << " N=" << N;
  TESSERA_CHECK(K % int4_k_multiple(scheme) == 0) << "K=" << K << " for " << int4_scheme_name(scheme);
  TESSERA_CHECK_GE(ldx, K);
  TESSERA_CHECK_GE(ldy, N);
  if (M == 0 || N == 0) return;
  const CpuIsa isa = std::min(options.isa, detected_cpu_isa());
  const QuantizedX qx = quantize_x(isa, x, M, K, ldx);
  const detail::Int4Args args{scheme, nibbles, scales, N, K, M, qx.q, qx.s, qx.sum, qx.sum16, bias, y, ldy, act};
  const int64_t panels = int4_panel_count(N);
  const int threads = omp_get_max_threads();
  if (threads == 1 || M * N * K < kMinParallelMacs || panels < 2) {
    run_panels(isa, args, 0, panels);
    return;
  }
  // Chunks of ~256 KiB of panels that threads take dynamically (decode_chunks.h); every row
  // of x passes over a chunk while it is in L2. Whole fours of panels: the decode kernel
  // streams four at a time, and a lone panel's dot products wait on each other (perf of
  // ~1.1B q4_0 decode: a third of the kernel's time went to single-panel tiles with chunks
  // cut anywhere).
  const detail::DecodeChunks chunks(panels, int4_panel_stride(scheme, K) + int4_record_stride(scheme, K), 4, threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks.count(); ++c) run_panels(isa, args, chunks.begin(c), chunks.begin(c + 1));
}

}  // namespace tessera::cpu
