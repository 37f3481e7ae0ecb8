// Portable flavour of the 4-bit (and 6-bit) linear kernels, and the reference the SIMD ones
// must equal bit for bit (tests/kernels/linear_int4_test.cc).
#include <cmath>

#include "common/dtype.h"
#include "kernels/cpu/linear_int4_kernels.h"

namespace tessera::cpu::detail {

namespace {

// Column c's s and m for weight group g of a panel's scale record `rec`.
void group_scale(Int4Scheme scheme, const uint8_t* rec, int64_t g, int64_t c, float* s, float* m) {
  switch (scheme) {
    case Int4Scheme::kSymmetric:
      *s = f16_to_f32(reinterpret_cast<const uint16_t*>(rec)[g * kInt4PanelColumns + c]);
      *m = 8.0f * *s;
      return;
    case Int4Scheme::kSuperBlock: {
      const uint8_t* r = rec + (g / 8) * kInt4SuperRecordBytes;
      const int64_t sub = g % 8;
      *s = f16_to_f32(reinterpret_cast<const uint16_t*>(r)[c]) * static_cast<float>(r[128 + sub * 32 + c]);
      *m = f16_to_f32(reinterpret_cast<const uint16_t*>(r + 64)[c]) * static_cast<float>(r[384 + sub * 32 + c]);
      return;
    }
    case Int4Scheme::kSixBit: {
      const uint8_t* r = rec + (g / 16) * kSixBitRecordBytes;
      const int8_t sc = static_cast<int8_t>(r[64 + (g % 16) * 32 + c]);
      *s = f16_to_f32(reinterpret_cast<const uint16_t*>(r)[c]) * static_cast<float>(sc);
      *m = 32.0f * *s;
      return;
    }
  }
}

// Column c's q at input k of a panel (kernels/int4_layout.h).
int q_at(Int4Scheme scheme, const uint8_t* panel, int64_t c, int64_t k) {
  const uint8_t* step = panel + (k / 4) * int4_step_bytes(scheme);
  int q = (step[4 * (c % 16) + k % 4] >> (c < 16 ? 0 : 4)) & 0x0f;
  if (scheme == Int4Scheme::kSixBit) q |= ((step[64 + 4 * (c % 8) + k % 4] >> (2 * (c / 8))) & 0x03) << 4;
  return q;
}

}  // namespace

void int4_panels_scalar(const Int4Args& a, int64_t p0, int64_t p1) {
  const int64_t G = int4_weight_group(a.scheme), groups = a.K / G, x_groups = a.K / kInt4Group;
  const int32_t* xsum = a.scheme == Int4Scheme::kSixBit ? a.xsum16 : a.xsum;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.nibbles + p * int4_panel_stride(a.scheme, a.K);
    const uint8_t* rec = a.scales + p * int4_record_stride(a.scheme, a.K);
    for (int64_t c = 0; c < kInt4PanelColumns && p * kInt4PanelColumns + c < a.N; ++c) {
      for (int64_t m = 0; m < a.M; ++m) {
        const int8_t* x = a.xq + m * a.K;
        float total = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t P = 0;
          for (int64_t k = g * G; k < (g + 1) * G; ++k) P += q_at(a.scheme, panel, c, k) * int32_t{x[k]};
          float s = 0.0f, mo = 0.0f;
          group_scale(a.scheme, rec, g, c, &s, &mo);
          const float xs = a.xs[m * x_groups + g * G / kInt4Group];
          total = std::fma(static_cast<float>(P), s * xs, total);
          total = std::fma(-mo, xs * static_cast<float>(xsum[m * groups + g]), total);
        }
        const int64_t n = p * kInt4PanelColumns + c;
        a.y[m * a.ldy + n] = finish_output(total, a.bias, n, a.act);
      }
    }
  }
}

}  // namespace tessera::cpu::detail
