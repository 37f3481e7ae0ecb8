// The CPU linear layer's front: the instruction-set flavour (CPU support, optionally
// lowered by the options), the regime by M, and the GEMV's output columns split across
// OpenMP threads.
#include "kernels/cpu/linear_cpu.h"

#include <cpuid.h>
#include <omp.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cpu/decode_chunks.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/linear_kernels.h"

namespace tessera::cpu {

CpuIsa detected_cpu_isa() {
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0).
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for
    // __builtin_cpu_supports. It uses the YMM state AVX2 already needs.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      return CpuIsa::kAvx512;
    }
    return avx2 ? CpuIsa::kAvx2 : CpuIsa::kScalar;
  }();
  return isa;
}

CpuIsa usable_cpu_isa(std::optional<CpuIsa> limit) {
  const CpuIsa best = detected_cpu_isa();
  return limit ? std::min(*limit, best) : best;
}

int64_t gemv_rows_before_packed_gemm(CpuIsa isa, DType w_dtype, bool bf16_dot) {
  if (isa != CpuIsa::kAvx512) return 8;
  if (w_dtype == DType::kF32) return 4;
  // With bf16 dot products every batch goes to gemv_bf16_dot (linear_with below), which
  // reads W in place like the GEMV but does 32 products per instruction and needs no
  // widening: ~100M bf16 decode, tessera-bench, interleaved, 2026-12-02: batch 2 253-260
  // tok/s against 181-200 on the f32 GEMV, batch 3 283-326 against 239-270, batch 4 374-402
  // against 255-313; ~1.1B batch 2 25-33 against 20-24. Batch 1 too: on ~1.1B (rows 2048
  // and 5632 wide) 23.1-23.5 tok/s against 18.3-20.8 on the f32 GEMV (three interleaved
  // pairs, 2026-12-04); on ~100M no slower (123-137 against 119-146, 2026-12-02).
  if (w_dtype == DType::kBF16 && bf16_dot && detail::cpu_has_bf16_dot()) return 0;
  return 12;
}

namespace {

void gemv_range(CpuIsa isa, const detail::LinearArgs& a, int64_t n0, int64_t n1) {
  switch (isa) {
    case CpuIsa::kAvx512: detail::gemv_avx512(a, 0, a.M, n0, n1); break;
    case CpuIsa::kAvx2: detail::gemv_avx2(a, 0, a.M, n0, n1); break;
    case CpuIsa::kScalar: detail::gemv_scalar(a, 0, a.M, n0, n1); break;
  }
}

// Below this many multiply-adds a parallel region costs more than it saves.
constexpr int64_t kMinParallelMacs = 32 * 1024;

// Decode: weight rows in chunks that threads take dynamically (decode_chunks.h).
void gemv_linear(CpuIsa isa, const detail::LinearArgs& a) {
  const int threads = omp_get_max_threads();
  if (threads == 1 || a.M * a.N * a.K < kMinParallelMacs || a.N < 2) {
    gemv_range(isa, a, 0, a.N);
    return;
  }
  const detail::DecodeChunks chunks(a.N, a.K * static_cast<int64_t>(dtype_size(a.w_dtype)), 16, threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks.count(); ++c) gemv_range(isa, a, chunks.begin(c), chunks.begin(c + 1));
}

}  // namespace

namespace detail {

void linear_with(const LinearOptions& options, const float* x, int64_t M, int64_t K, int64_t ldx,
                 const void* w, DType w_dtype, int64_t N, const float* bias, float* y, int64_t ldy,
                 Activation act) {
  TESSERA_CHECK(M >= 0 && K >= 0 && N >= 0) << "M=" << M << " K=" << K << " N=" << N;
  TESSERA_CHECK_GE(ldx, K);
  TESSERA_CHECK_GE(ldy, N);
  TESSERA_CHECK(w_dtype == DType::kF32 || w_dtype == DType::kF16 || w_dtype == DType::kBF16)
      << "linear weights must be f32, f16 or bf16, got " << dtype_name(w_dtype);
  if (M == 0 || N == 0) return;
  const LinearArgs args{x, M, K, ldx, w, w_dtype, N, bias, y, ldy, act};
  const CpuIsa isa = std::min(options.isa, detected_cpu_isa());
  // The GEMV/GEMM crossover depends on which GEMM would take the call.
  const bool packed = options.gemm == GemmKernel::kPacked ||
                      (options.gemm == GemmKernel::kAuto && packed_gemm_preferred(isa, w_dtype, M, options.gemm_policy));
  const int64_t gemv_rows =
      packed ? gemv_rows_before_packed_gemm(isa, w_dtype, options.bf16_dot) : linear_gemv_max_rows(w_dtype);
  const bool gemv = options.path == LinearPath::kGemv || (options.path == LinearPath::kAuto && M <= gemv_rows) || K == 0;
  const bool bf16_dot = options.bf16_dot && w_dtype == DType::kBF16 && isa == CpuIsa::kAvx512 && cpu_has_bf16_dot();
  if (gemv) {
    gemv_linear(isa, args);
  } else if (packed && bf16_dot && M <= kBf16DotGemvMaxRows && options.gemm == GemmKernel::kAuto) {
    gemv_bf16_dot(args);
  } else if (packed) {
    TESSERA_CHECK(gemm_packed_supported(isa)) << "no packed GEMM kernel for " << cpu_isa_name(isa);
    gemm_packed(isa, args, nullptr, options.bf16_dot);
  } else {
    LinearOptions clamped = options;
    clamped.isa = isa;
    gemm_linear(clamped, args);
  }
}

LinearOptions linear_options(const CpuKernelOptions& options) {
  LinearOptions linear;
  linear.isa = usable_cpu_isa(options.isa);
  // bf16 dot products are on by default: a bf16 model computes in bf16 in transformers,
  // vLLM's CPU backend and llama.cpp alike, and on AVX512_BF16 CPUs it doubles the
  // compute-bound throughput (docs/performance-cpu.md, "bf16 dot products").
  linear.bf16_dot = options.bf16_dot;
  linear.gemm_policy = options.gemm;
  return linear;
}

bool packed_gemm_preferred(CpuIsa isa, DType w_dtype, int64_t M, GemmKernel policy) {
  // A policy other than kAuto overrides the measured choice (A/B runs of whole models).
  if (policy != GemmKernel::kAuto) return policy == GemmKernel::kPacked && gemm_packed_supported(isa);
  // Figures in docs/performance-cpu.md ("Packed GEMM vs OpenBLAS"). AVX-512 CPUs: the 8 x 32
  // micro-kernel beat OpenBLAS at every measured shape and dtype (8-512 rows), so it takes
  // every call. AVX2 CPUs: the 6 x 16 kernel was 1.0-1.6x OpenBLAS at 8-64 rows for f32 and
  // bf16 and equal or better at 512 rows for 16-bit weights (OpenBLAS must widen them
  // first), but 3-12% behind at 512 rows of f32 weights, so f32 from 256 rows (between the
  // measured 64 and 512) stays on OpenBLAS. The scalar flavour has no packed kernel.
  if (isa == CpuIsa::kAvx512) return true;
  if (isa != CpuIsa::kAvx2) return false;
  return !(w_dtype == DType::kF32 && M >= 256);
}

}  // namespace detail

void linear(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
            int64_t N, const float* bias, float* y, int64_t ldy, Activation act) {
  detail::linear_with(detail::LinearOptions{}, x, M, K, ldx, w, w_dtype, N, bias, y, ldy, act);
}

}  // namespace tessera::cpu
