#pragma once
// The SiLU-gated product of a gated MLP (Llama's, Mistral's, Qwen's ...), one row:
// out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i]. With one row of x (decode) the row
// is too short to share between threads, so the exp per element is what it costs: a scalar
// std::exp per element was ~2% of a 4-bit ~1.1B decode step, spent on one thread while the
// other waited (perf, 2026-12-07).
#include <cstdint>

#include "kernels/cpu/linear_cpu.h"  // CpuIsa

namespace tessera::cpu {

// On AVX2 CPUs (and above) the vector exp of exp_simd.h (|relative error| < 2e-7), 8 lanes at a
// time, the tail too; std::exp otherwise. Each element's result depends only on g[i] and u[i]
// (not on n or on where the row lies), so a row gets the same bits alone and in a batch.
void gated_silu_row(CpuIsa isa, const float* g, const float* u, int64_t n, float* out);

}  // namespace tessera::cpu
