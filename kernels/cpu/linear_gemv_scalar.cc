// Portable fallback of the linear kernels: no SIMD intrinsics, runs on any x86-64 (or other)
// CPU. Each weight row is widened once into a row buffer, then dotted with every x row.
#include <vector>

#include "kernels/cpu/linear_kernels.h"

namespace tessera::cpu::detail {

void widen_scalar(const uint16_t* src, DType src_dtype, float* dst, int64_t n) {
  if (src_dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
  }
}

void gemv_scalar(const LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  thread_local std::vector<float> row_buffer;
  if (a.w_dtype != DType::kF32 && static_cast<int64_t>(row_buffer.size()) < K) {
    row_buffer.resize(K);
  }
  for (int64_t n = n0; n < n1; ++n) {
    const float* w_row;
    if (a.w_dtype == DType::kF32) {
      w_row = static_cast<const float*>(a.w) + n * K;
    } else {
      widen_scalar(static_cast<const uint16_t*>(a.w) + n * K, a.w_dtype, row_buffer.data(), K);
      w_row = row_buffer.data();
    }
    for (int64_t m = m0; m < m1; ++m) {
      const float* x_row = a.x + m * a.ldx;
      // Four partial sums: independent chains for the FPU, and less rounding drift than one.
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t k = 0;
      for (; k + 4 <= K; k += 4) {
        s0 += x_row[k] * w_row[k];
        s1 += x_row[k + 1] * w_row[k + 1];
        s2 += x_row[k + 2] * w_row[k + 2];
        s3 += x_row[k + 3] * w_row[k + 3];
      }
      for (; k < K; ++k) s0 += x_row[k] * w_row[k];
      a.y[m * a.ldy + n] = finish_output((s0 + s1) + (s2 + s3), a.bias, n, a.act);
    }
  }
}

}  // namespace tessera::cpu::detail
