#pragma once
// The compute roofline that prefill (and batched decode) is compared against: the f32
// fused-multiply-add rate this CPU sustains on all OpenMP threads, measured, not taken from
// a data sheet (clocks under a hypervisor and with neighbours are whatever they are).

namespace tessera {

// Runs independent chains of f32 FMAs in registers (no memory traffic) on every OpenMP
// thread (omp_get_max_threads()) for about `seconds_per_try` each try, best of `tries`
// (many short tries: on a shared machine the best one is the one no neighbour preempted),
// with the widest vectors this CPU has (AVX-512, else AVX2 + FMA, else scalar). Returns
// GFLOP/s counting a multiply-add as 2 flops (1e9 flops per GFLOP).
double measure_peak_fma_gflop_s(double seconds_per_try = 0.02, int tries = 10);

// Which probe measure_peak_fma_gflop_s() runs here: "avx512", "avx2" or "scalar".
const char* peak_fma_isa();

// The same for AVX-512 BF16 dot products (vdpbf16ps: two bf16 products added per f32 lane,
// 4 flops per lane), the arithmetic of bf16 weights in prefill and batched decode where the
// CPU has it (kernels/cpu/gemm_packed.h): twice the FMA rate on the CPUs measured, so a
// bf16 model's compute fraction against the FMA peak could read above 1. 0 where the CPU
// has no AVX512_BF16.
bool cpu_has_bf16_dot_probe();
double measure_peak_bf16_dot_gflop_s(double seconds_per_try = 0.02, int tries = 10);

}  // namespace tessera
