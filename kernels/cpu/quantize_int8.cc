// Load-time quantization of a weight matrix to int8 with per-group scales (linear_int8.h).
// Runs once per tensor-parallel slice, so it favours clarity over speed.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/linear_int8.h"
#include "kernels/cpu/linear_int8_kernels.h"

namespace tessera::cpu {
namespace {

float element(const void* w, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(w)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    default: break;
  }
  TESSERA_CHECK(false) << "quantize_int8: weights must be f32, f16 or bf16, got " << dtype_name(dtype);
  return 0.0f;
}

}  // namespace

void quantize_int8(const void* w, DType w_dtype, int64_t N, int64_t K, int64_t group, int8_t* q, float* scales) {
  TESSERA_CHECK(group > 0 && K % group == 0) << "K=" << K << " group=" << group;
  const int64_t groups = K / group;
  // Rows of a large matrix: widened to f32 and quantized 16 lanes at a time where the CPU has
  // AVX-512 (quantize_row_int8_avx512 gives the scalar rule's bytes, bit for bit), which is
  // most of the time of loading a GGUF file's q6_K / q8_0 matrices as int8.
  const bool simd = group % 16 == 0 && detected_cpu_isa() == CpuIsa::kAvx512;
#pragma omp parallel if (N * K >= (int64_t{1} << 20))
  {
    std::vector<float> row(simd ? static_cast<size_t>(K) : 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      if (simd) {
        for (int64_t k = 0; k < K; ++k) row[static_cast<size_t>(k)] = element(w, w_dtype, n * K + k);
        detail::quantize_row_int8_avx512(row.data(), K, group, q + n * K, scales + n * groups);
        continue;
      }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t base = n * K + g * group;
        float amax = 0.0f;
        for (int64_t k = 0; k < group; ++k) amax = std::max(amax, std::fabs(element(w, w_dtype, base + k)));
        const float scale = amax / 127.0f;
        scales[n * groups + g] = scale;
        for (int64_t k = 0; k < group; ++k) {
          // nearbyint rounds half to even in the default rounding mode; the clamp only guards
          // against a rounding of amax / scale to 127.00001.
          const float v = scale == 0.0f ? 0.0f : std::nearbyint(element(w, w_dtype, base + k) / scale);
          q[base + k] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
        }
      }
    }
  }
}

}  // namespace tessera::cpu
