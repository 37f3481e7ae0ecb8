// Portable flavour of the int8 linear kernels (and the reference the SIMD ones are tested
// against, with the dequantized-f32 product in tests/kernels/linear_int8_test.cc).
#include "kernels/cpu/linear_int8_kernels.h"

namespace tessera::cpu::detail {

void gemv_int8_scalar(const Int8LinearArgs& a, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t groups = a.K / a.group;
  for (int64_t m = m0; m < m1; ++m) {
    const float* x = a.x + m * a.ldx;
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* w = a.w + n * a.K;
      const float* s = a.scales + n * groups;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0.0f;
        for (int64_t k = g * a.group; k < (g + 1) * a.group; ++k) part += static_cast<float>(w[k]) * x[k];
        acc += part * s[g];
      }
      a.y[m * a.ldy + n] = finish_output(acc, a.bias, n, a.act);
    }
  }
}

void dequantize_int8_scalar(const Int8LinearArgs& a, int64_t n0, int64_t n1, float* out) {
  const int64_t groups = a.K / a.group;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* w = a.w + n * a.K;
    const float* s = a.scales + n * groups;
    float* o = out + (n - n0) * a.K;
    for (int64_t k = 0; k < a.K; ++k) o[k] = static_cast<float>(w[k]) * s[k / a.group];
  }
}

}  // namespace tessera::cpu::detail

namespace tessera::cpu::detail {

void gemv_int8_dot_scalar(const Int8DotArgs& d, int64_t n0, int64_t n1) {
  const Int8LinearArgs& a = *d.a;
  const int64_t groups = a.K / a.group;
  for (int64_t m = 0; m < a.M; ++m) {
    const int8_t* x = d.xq + m * a.K;
    const float* xs = d.xs + m * groups;
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* w = a.w + n * a.K;
      const float* ws = a.scales + n * groups;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t k = g * a.group; k < (g + 1) * a.group; ++k) dot += int32_t{w[k]} * int32_t{x[k]};
        acc += static_cast<float>(dot) * (ws[g] * xs[g]);
      }
      a.y[m * a.ldy + n] = finish_output(acc, a.bias, n, a.act);
    }
  }
}

}  // namespace tessera::cpu::detail
