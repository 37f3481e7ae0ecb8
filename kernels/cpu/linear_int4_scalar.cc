// Portable flavour of the low-bit linear kernels (every scheme of kernels/int4_layout.h), and
// the reference the SIMD ones must equal bit for bit (tests/kernels/linear_int4_test.cc).
#include <cmath>

#include "kernels/cpu/linear_int4_kernels.h"

namespace tessera::cpu::detail {

void int4_panels_scalar(const Int4Args& a, int64_t p0, int64_t p1) {
  const int64_t G = int4_weight_group(a.scheme), groups = a.K / G, x_groups = a.K / kInt4Group;
  const int32_t* xsum = a.scheme == Int4Scheme::kSixBit ? a.xsum16 : a.xsum;
  const int32_t offset = int4_q_offset(a.scheme);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.nibbles + p * int4_panel_stride(a.scheme, a.K);
    const uint8_t* rec = a.scales + p * int4_record_stride(a.scheme, a.K);
    for (int64_t c = 0; c < kInt4PanelColumns && p * kInt4PanelColumns + c < a.N; ++c) {
      for (int64_t m = 0; m < a.M; ++m) {
        const int8_t* x = a.xq + m * a.K;
        float total = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t P = 0;
          for (int64_t k = g * G; k < (g + 1) * G; ++k) P += int4_q_at(a.scheme, panel, c, k) * int32_t{x[k]};
          float s = 0.0f, mo = 0.0f;
          int4_group_scale(a.scheme, rec, g, c, &s, &mo);
          const float xs = a.xs[m * x_groups + g * G / kInt4Group];
          const int32_t X = xsum[m * groups + g];
          if (offset != 0) {
            total = std::fma(static_cast<float>(P - offset * X), s * xs, total);
          } else {
            total = std::fma(static_cast<float>(P), s * xs, total);
            total = std::fma(-mo, xs * static_cast<float>(X), total);
          }
        }
        const int64_t n = p * kInt4PanelColumns + c;
        a.y[m * a.ldy + n] = finish_output(total, a.bias, n, a.act);
      }
    }
  }
}

}  // namespace tessera::cpu::detail
