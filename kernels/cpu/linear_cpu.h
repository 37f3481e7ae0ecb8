#pragma once
// The CPU linear layer: y = x · W^T (+ bias) (then an activation). The engine's hot spot.
//
// Two regimes, chosen by M (rows of x):
//  - small M (decode; up to gemv_rows_before_packed_gemm() rows where the packed GEMM takes
//    the rest, up to linear_gemv_max_rows() where OpenBLAS does): memory-bandwidth bound. A GEMV-style
//    kernel streams every weight row once per tile of up to 8 rows of x, widening f16/bf16
//    to f32 in registers.
//  - larger M (prefill, batched decode): compute bound. A packed, cache-blocked GEMM that
//    reads f32/f16/bf16 weights in their own dtype (gemm_packed.h) where it measures faster
//    than OpenBLAS, else OpenBLAS sgemm with f16/bf16 weights widened panel by panel.
// The SIMD flavour (AVX-512 / AVX2+FMA+F16C / portable scalar) is picked at run time from
// what the CPU supports; CpuKernelOptions::isa lowers it (for tests and A/B runs). Every
// choice comes in through LinearOptions (the CPU backend makes them from its
// CpuKernelOptions, common/kernel_options.h); nothing here reads the process's environment.
#include <cstdint>
#include <optional>

#include "common/dtype.h"
#include "common/kernel_options.h"
#include "kernels/activation.h"

namespace tessera::cpu {

// y[M, N] = x[M, K] · W[N, K]^T (+ bias[N]) (then `act`, as kernels/cpu/activations.h
// computes it). x, y, bias: float32 row-major; y rows `ldy` floats apart (ldy >= N) so outputs can land
// in a column range of a wider buffer (columns N..ldy-1 are never touched); x rows `ldx` apart
// (ldx >= K). W: row-major [N, K] stored as f32, f16 or bf16, rows exactly K apart. bias may be
// nullptr. Multi-threaded with OpenMP over omp_get_max_threads() threads. y must not overlap x,
// W or bias. With the default CpuKernelOptions (the CPU backend passes its own).
void linear(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
            int64_t N, const float* bias, float* y, int64_t ldy, Activation act);

// Up to this many rows of x the GEMV kernel is used when OpenBLAS sgemm would take the
// larger calls. Measured crossover
// (bench/linear_bench.cc BM_GemvGemmCrossover, 4096x4096, 2 threads): f32 weights 12 rows,
// f16/bf16 16 rows (sgemm on 16-bit weights pays for widening them first).
inline int64_t linear_gemv_max_rows(DType w_dtype) { return w_dtype == DType::kF32 ? 12 : 16; }

// The best flavour this CPU supports (CpuIsa, common/kernel_options.h).
CpuIsa detected_cpu_isa();
// The flavour kernels given `limit` (CpuKernelOptions::isa) run: detected_cpu_isa(), lowered
// to `limit` when there is one (never raised above what the CPU supports).
CpuIsa usable_cpu_isa(std::optional<CpuIsa> limit);

// When the packed GEMM would take the larger calls, up to this many rows of x the GEMV runs
// instead (bench/linear_bench.cc BM_GemmKernel kernels 1 vs 3, 4096 x 768):
//  - AVX2 (6 x 16 tiles, one thread): 8 rows for every dtype (at 8 rows the GEMV is ~1.4x
//    faster, at 12 the packed GEMM 1.1x (bf16) to 1.4x (f32));
//  - AVX-512 (8 x 32 tiles, two threads): f32 4 rows (at 8 rows the packed GEMM is 1.23x
//    faster, at 4 the GEMV 1.6x), f16/bf16 12 rows (the GEMV reads half the bytes: at 12
//    rows it is 1.2x faster, at 16 the packed GEMM 1.16x); bf16 with bf16 dot products
//    (bf16_dot, the default where the CPU has AVX512_BF16) 0 rows: 1 to 16 rows take
//    gemv_bf16_dot, more the packed GEMM's bf16 dot kernel.
int64_t gemv_rows_before_packed_gemm(CpuIsa isa, DType w_dtype, bool bf16_dot = false);

namespace detail {
// Knobs for tests and benchmarks; linear() uses the defaults.
enum class LinearPath : uint8_t { kAuto, kGemv, kGemm };  // kGemv/kGemm force a regime for any M
// How the sgemm regime shares the cores between OpenBLAS (a pthreads build with its own
// thread pool) and OpenMP; see linear_gemm.cc for the measured choice.
enum class GemmThreading : uint8_t {
  kBlasThreads,  // OpenMP widens a panel, then one sgemm threaded by OpenBLAS
  kOmpPanels,    // OpenBLAS single-threaded; each OpenMP thread widens and sgemms its own panels
};
// Which GEMM runs the M > gemv rows regime: the packed GEMM (gemm_packed.h; weights read in
// their own dtype) or OpenBLAS sgemm (linear_gemm.cc) (common/kernel_options.h).
using ::tessera::cpu::GemmKernel;
struct LinearOptions {
  // From the backend's CpuKernelOptions (linear_options below); the defaults are its defaults.
  CpuIsa isa = detected_cpu_isa();  // clamped to detected_cpu_isa()
  // Whether bf16 weights on the packed GEMM multiply x rounded to bf16 with vdpbf16ps where
  // the CPU has AVX512_BF16 (gemm_packed.h says what that changes).
  bool bf16_dot = true;
  GemmKernel gemm_policy = GemmKernel::kAuto;  // packed_gemm_preferred's policy
  // Forcing knobs for tests and benchmarks.
  LinearPath path = LinearPath::kAuto;
  GemmThreading threading = GemmThreading::kOmpPanels;  // OpenBLAS only
  GemmKernel gemm = GemmKernel::kAuto;  // kPacked / kOpenBlas: that kernel; kAuto: gemm_policy decides
};
LinearOptions linear_options(const CpuKernelOptions& options);
// Whether the packed GEMM takes the GEMM regime for this instruction set, weight dtype and
// row count: kAuto by measurement (see linear_cpu.cc), kPacked wherever the flavour has a
// packed kernel, kOpenBlas never.
bool packed_gemm_preferred(CpuIsa isa, DType w_dtype, int64_t M, GemmKernel policy = GemmKernel::kAuto);
void linear_with(const LinearOptions& options, const float* x, int64_t M, int64_t K, int64_t ldx,
                 const void* w, DType w_dtype, int64_t N, const float* bias, float* y, int64_t ldy,
                 Activation act);
}  // namespace detail

}  // namespace tessera::cpu
