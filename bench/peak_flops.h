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

}  // namespace tessera
