// Portable flavour of the 4-bit linear kernels, and the reference the SIMD ones must equal
// bit for bit (tests/kernels/linear_int4_test.cc).
#include <cmath>

#include "common/dtype.h"
#include "kernels/cpu/linear_int4_kernels.h"

namespace tessera::cpu::detail {

namespace {

// Column c's s and m for group g of a panel's scale record `rec`.
void group_scale(Int4Scheme scheme, const uint8_t* rec, int64_t g, int64_t c, float* s, float* m) {
  if (scheme == Int4Scheme::kSymmetric) {
    *s = f16_to_f32(reinterpret_cast<const uint16_t*>(rec)[g * kInt4PanelColumns + c]);
    *m = 8.0f * *s;
    return;
  }
  const uint8_t* r = rec + (g / 8) * kInt4SuperRecordBytes;
  const int64_t sub = g % 8;
  *s = f16_to_f32(reinterpret_cast<const uint16_t*>(r)[c]) * static_cast<float>(r[128 + sub * 32 + c]);
  *m = f16_to_f32(reinterpret_cast<const uint16_t*>(r + 64)[c]) * static_cast<float>(r[384 + sub * 32 + c]);
}

}  // namespace

void int4_panels_scalar(const Int4Args& a, int64_t p0, int64_t p1) {
  const int64_t groups = a.K / kInt4Group;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.nibbles + p * int4_panel_stride(a.K);
    const uint8_t* rec = a.scales + p * int4_record_stride(a.scheme, a.K);
    for (int64_t c = 0; c < kInt4PanelColumns && p * kInt4PanelColumns + c < a.N; ++c) {
      const int lane = static_cast<int>(c % 16), shift = c < 16 ? 0 : 4;
      for (int64_t m = 0; m < a.M; ++m) {
        const int8_t* x = a.xq + m * a.K;
        float total = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t P = 0;
          for (int64_t k = g * kInt4Group; k < (g + 1) * kInt4Group; ++k) {
            const int q = (panel[(k / 4) * 64 + 4 * lane + k % 4] >> shift) & 0x0f;
            P += q * int32_t{x[k]};
          }
          float s, mo;
          group_scale(a.scheme, rec, g, c, &s, &mo);
          const float xs = a.xs[m * groups + g];
          total = std::fma(static_cast<float>(P), s * xs, total);
          total = std::fma(-mo, xs * static_cast<float>(a.xsum[m * groups + g]), total);
        }
        const int64_t n = p * kInt4PanelColumns + c;
        a.y[m * a.ldy + n] = finish_output(total, a.bias, n, a.act);
      }
    }
  }
}

}  // namespace tessera::cpu::detail
