// The CPU int8 weight-only linear layer against a plain double-precision product with the
// dequantized weights (q * scale, computed here independently of the kernels), over awkward
// shapes (N not a multiple of any tile, M across the tile sizes and both regimes), every
// group size, every instruction-set flavour this CPU has, with and without bias and an
// activation; and the quantizer's own guarantees.
//
// Tolerance, per element: |y - ref| <= 1e-5 * sqrt(K) * max|x| * max|dequant(w)| + 1e-6 * |ref|
// (f32 accumulation in any order, and the f32 activation), as tests/kernels/linear_cpu_test.cc.
#include "kernels/cpu/linear_int8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/linear_int8_kernels.h"
#include "kernels/cpu/linear_int8_panels.h"
#include "tests/kernels/isa_param_test.h"

namespace tessera::cpu {
namespace {

using detail::Int8LinearOptions;
using detail::LinearPath;

struct Int8Case {
  int64_t M, N, K, group;
};

double silu_reference(double v) { return v / (1.0 + std::exp(-v)); }

class LinearInt8Test : public IsaParamTest {
 protected:
  // panels: the weights packed into load-time panels (linear_int8_panels.h) and multiplied
  // there, with the same 16-bit-x arithmetic (AVX-512 VNNI only).
  void check(const Int8Case& c, LinearPath path, bool bias, Activation act, bool int8_activations = false,
             bool panels = false) {
    std::mt19937 rng(static_cast<uint32_t>(c.M * 7919 + c.N * 31 + c.K + c.group));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(c.N * c.K), x(c.M * c.K), b(c.N);
    for (float& v : w) v = u(rng);
    // Rows of very different magnitudes, and one all-zero group: scales must follow each group.
    for (int64_t k = 0; k < c.K; ++k) w[k] *= 1e-3f;
    for (int64_t k = 0; k < c.group && c.N > 1; ++k) w[c.K + k] = 0.0f;
    for (float& v : x) v = u(rng);
    for (float& v : b) v = u(rng);
    std::vector<int8_t> q(c.N * c.K);
    std::vector<float> scales(c.N * (c.K / c.group));
    quantize_int8(w.data(), DType::kF32, c.N, c.K, c.group, q.data(), scales.data());

    std::vector<float> y(c.M * c.N, std::nanf(""));
    Int8LinearOptions opt;
    opt.isa = GetParam();
    opt.path = path;
    opt.int8_activations = int8_activations;
    opt.int16_x = int16_x_;
    if (panels) {
      std::vector<int8_t> wp(int8_panel_count(c.N) * c.K * kInt8PanelColumns, 99);
      std::vector<float> sp(int8_panel_count(c.N) * (c.K / c.group) * kInt8PanelColumns, 99.0f);
      pack_int8_panels(q.data(), scales.data(), c.N, c.K, c.group, wp.data(), sp.data());
      detail::linear_int8_panels_with(path, x.data(), c.M, c.K, c.K, wp.data(), sp.data(), c.group, c.N,
                                      bias ? b.data() : nullptr, y.data(), c.N, act);
    } else {
      detail::linear_int8_with(opt, x.data(), c.M, c.K, c.K, q.data(), scales.data(), c.group, c.N,
                               bias ? b.data() : nullptr, y.data(), c.N, act);
    }
    // With int8 activations the kernel computes with x quantized by the same rule as w; the
    // weight-only kernels of AVX-512 VNNI CPUs with x in 16-bit fixed point per group.
    std::vector<float> xr = x;
    const bool gemv = path == LinearPath::kGemv || (path == LinearPath::kAuto && c.M <= linear_int8_gemv_max_rows(opt));
    if (panels || (!int8_activations && (gemv ? detail::int8_gemv_uses_int16_x(opt)
                                              : detail::int8_gemm_uses_int16_x(opt)))) {
      for (int64_t i = 0; i < c.M * c.K; i += c.group) {
        float amax = 0.0f;
        for (int64_t k = 0; k < c.group; ++k) amax = std::max(amax, std::fabs(x[i + k]));
        const float scale = amax / 32767.0f;
        for (int64_t k = 0; k < c.group; ++k)
          xr[i + k] = scale == 0.0f ? 0.0f : std::nearbyint(x[i + k] / scale) * scale;
      }
    }
    if (int8_activations) {
      std::vector<int8_t> xq(c.M * c.K);
      std::vector<float> xs(c.M * (c.K / c.group));
      quantize_int8(x.data(), DType::kF32, c.M, c.K, c.group, xq.data(), xs.data());
      for (int64_t i = 0; i < c.M * c.K; ++i) xr[i] = float(xq[i]) * xs[i / c.group];
    }
    double max_w = 0, max_x = 0;
    for (int64_t i = 0; i < c.N * c.K; ++i)
      max_w = std::max(max_w, std::fabs(double(q[i]) * scales[i / c.group]));
    for (float v : x) max_x = std::max(max_x, double(std::fabs(v)));
    const double abs_tol = 1e-5 * std::sqrt(double(c.K)) * max_x * max_w;
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = 0; n < c.N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < c.K; ++k)
          ref += double(q[n * c.K + k]) * double(scales[n * (c.K / c.group) + k / c.group]) * xr[m * c.K + k];
        if (bias) ref += b[n];
        if (act == Activation::kSilu) ref = silu_reference(ref);
        ASSERT_NEAR(y[m * c.N + n], ref, abs_tol + 1e-6 * std::fabs(ref))
            << "M=" << c.M << " N=" << c.N << " K=" << c.K << " group=" << c.group << " at (" << m << ", " << n << ")";
      }
    }
  }

  // false: x stays f32 and the kernels that widen int8 run (CpuKernelOptions::int8_x16 off).
  bool int16_x_ = true;
};

TEST_P(LinearInt8Test, GemvMatchesDequantizedReference) {
  for (const Int8Case& c : {Int8Case{1, 1, 32, 32}, Int8Case{1, 37, 192, 64}, Int8Case{2, 19, 256, 128},
                            Int8Case{3, 45, 512, 256}, Int8Case{4, 9, 96, 32}, Int8Case{5, 33, 192, 96},
                            Int8Case{8, 70, 128, 64}, Int8Case{9, 5, 64, 32}, Int8Case{16, 17, 256, 64}}) {
    check(c, LinearPath::kGemv, false, Activation::kNone);
    check(c, LinearPath::kGemv, true, Activation::kSilu);
  }
}

// The int8_x16 switch off: both regimes multiply the exact f32 x (the reference does not
// round it), which the process-wide TESSERA_CPU_INT8_X16=0 used to be needed for.
TEST_P(LinearInt8Test, F32XKernelsWhenInt16XIsOff) {
  int16_x_ = false;
  for (const Int8Case& c : {Int8Case{1, 37, 192, 64}, Int8Case{3, 45, 512, 256}, Int8Case{5, 33, 192, 96},
                            Int8Case{16, 17, 256, 64}, Int8Case{40, 300, 256, 128}, Int8Case{33, 70, 480, 96}}) {
    check(c, LinearPath::kGemv, true, Activation::kSilu);
    check(c, LinearPath::kGemm, false, Activation::kNone);
    check(c, LinearPath::kAuto, true, Activation::kNone);
  }
}

TEST_P(LinearInt8Test, Int8ActivationDotProductsMatchTheReferenceOfQuantizedX) {
  for (const Int8Case& c : {Int8Case{1, 1, 32, 32}, Int8Case{1, 37, 192, 64}, Int8Case{2, 19, 256, 128},
                            Int8Case{3, 45, 512, 256}, Int8Case{4, 9, 96, 32}, Int8Case{5, 33, 192, 96},
                            Int8Case{7, 70, 128, 64}, Int8Case{16, 17, 256, 64}, Int8Case{45, 33, 160, 32},
                            Int8Case{70, 130, 384, 128}, Int8Case{9, 33, 800, 32}, Int8Case{33, 70, 480, 96}}) {
    check(c, LinearPath::kGemv, false, Activation::kNone, /*int8_activations=*/true);
    check(c, LinearPath::kGemv, true, Activation::kSilu, /*int8_activations=*/true);
    // Above the GEMV's rows too: prefill keeps the decode's arithmetic (on AVX-512 VNNI the
    // 8-bit-x GEMM, whose K blocks end in a half 64-k step at K = 800, group 32).
    check(c, LinearPath::kAuto, true, Activation::kNone, /*int8_activations=*/true);
    check(c, LinearPath::kGemm, false, Activation::kSilu, /*int8_activations=*/true);
  }
}

TEST_P(LinearInt8Test, DequantizedGemmMatchesReference) {
  // Also K blocks of whole groups with a short last one (group 96: blocks 192, 192, 96;
  // group 256: one block per group), as the AVX-512 VNNI GEMM cuts K.
  for (const Int8Case& c : {Int8Case{1, 3, 64, 32}, Int8Case{17, 41, 192, 64}, Int8Case{40, 300, 256, 128},
                            Int8Case{64, 1100, 96, 32}, Int8Case{33, 70, 480, 96}, Int8Case{25, 45, 768, 256},
                            Int8Case{9, 33, 800, 32}}) {
    check(c, LinearPath::kGemm, false, Activation::kNone);
    check(c, LinearPath::kGemm, true, Activation::kSilu);
  }
}

TEST_P(LinearInt8Test, AutoRegimeOnBothSidesOfTheCrossover) {
  for (bool int8_activations : {false, true}) {
    Int8LinearOptions opt;
    opt.isa = GetParam();
    opt.int8_activations = int8_activations;
    const int64_t rows = linear_int8_gemv_max_rows(opt);
    check({rows, 50, 128, 32}, LinearPath::kAuto, true, Activation::kNone, int8_activations);
    check({rows + 1, 50, 128, 32}, LinearPath::kAuto, true, Activation::kNone, int8_activations);
  }
}

// Load-time panels: every regime (the GEMV's tiles of 4, 2 and 1 rows with 1-4 panels at a
// time, the GEMM's 8-row tiles with short K blocks), N past a multiple of 32 by 1-31
// columns, every group size.
class LinearInt8PanelsTest : public LinearInt8Test {};

TEST_P(LinearInt8PanelsTest, PanelsMatchTheReferenceOf16BitX) {
  if (!detail::cpu_has_avx512_vnni()) GTEST_SKIP() << "SKIPPED: int8 panels run on AVX-512 VNNI CPUs only";
  for (const Int8Case& c : {Int8Case{1, 1, 32, 32}, Int8Case{1, 37, 192, 64}, Int8Case{2, 19, 256, 128},
                            Int8Case{3, 45, 512, 256}, Int8Case{4, 9, 96, 32}, Int8Case{5, 33, 192, 96},
                            Int8Case{7, 70, 128, 64}, Int8Case{1, 161, 64, 32}, Int8Case{2, 200, 128, 32},
                            Int8Case{9, 5, 64, 32}, Int8Case{16, 17, 256, 64}, Int8Case{45, 33, 160, 32},
                            Int8Case{70, 130, 384, 128}, Int8Case{9, 33, 800, 32}, Int8Case{33, 70, 480, 96},
                            Int8Case{25, 45, 768, 256}, Int8Case{64, 1100, 96, 32}}) {
    check(c, LinearPath::kGemv, false, Activation::kNone, false, /*panels=*/true);
    check(c, LinearPath::kGemm, true, Activation::kSilu, false, /*panels=*/true);
    check(c, LinearPath::kAuto, true, Activation::kNone, false, /*panels=*/true);
  }
  const int64_t rows = detail::int8_panel_gemv_max_rows();
  check({rows, 50, 128, 32}, LinearPath::kAuto, true, Activation::kNone, false, /*panels=*/true);
  check({rows + 1, 50, 128, 32}, LinearPath::kAuto, true, Activation::kNone, false, /*panels=*/true);
}

// The packing only moves values: every weight and scale lands where the layout says, and
// the columns past N are zero.
TEST(Int8PanelsTest, PackingPlacesEveryWeightAndScale) {
  const int64_t N = 45, K = 128, group = 64, P = int8_panel_count(N);
  std::vector<int8_t> q(N * K);
  std::vector<float> s(N * (K / group));
  for (int64_t i = 0; i < N * K; ++i) q[i] = static_cast<int8_t>(i * 37 % 255 - 127);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.5f + static_cast<float>(i);
  std::vector<int8_t> wp(P * K * kInt8PanelColumns, 99);
  std::vector<float> sp(P * (K / group) * kInt8PanelColumns, 99.0f);
  pack_int8_panels(q.data(), s.data(), N, K, group, wp.data(), sp.data());
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t c = 0; c < kInt8PanelColumns; ++c) {
      const int64_t n = p * kInt8PanelColumns + c;
      for (int64_t k = 0; k < K; ++k) {
        const int8_t got = wp[p * K * kInt8PanelColumns + (k / 2 * kInt8PanelColumns + c) * 2 + k % 2];
        ASSERT_EQ(got, n < N ? q[n * K + k] : 0) << "panel " << p << " column " << c << " k " << k;
      }
      for (int64_t g = 0; g < K / group; ++g) {
        ASSERT_EQ(sp[(p * (K / group) + g) * kInt8PanelColumns + c], n < N ? s[n * (K / group) + g] : 0.0f);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, LinearInt8Test, ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) { return std::string(cpu_isa_name(info.param)); });
INSTANTIATE_TEST_SUITE_P(Isa, LinearInt8PanelsTest, ::testing::Values(CpuIsa::kAvx512),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) { return std::string(cpu_isa_name(info.param)); });

// The quantizer: the largest |w| of a group maps to +-127, every weight is within half a
// step of its value, a zero group has scale 0, and f16/bf16 sources quantize their own values.
TEST(QuantizeInt8Test, PerGroupSymmetricRoundToNearest) {
  const int64_t N = 3, K = 128, G = 32;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(N * K);
  for (float& v : w) v = d(rng);
  for (int64_t k = 0; k < G; ++k) w[K + k] = 0.0f;  // row 1, group 0: all zero
  w[2 * K + 40] = 3.0f;                             // an outlier only affects its own group
  std::vector<int8_t> q(N * K);
  std::vector<float> s(N * K / G);
  quantize_int8(w.data(), DType::kF32, N, K, G, q.data(), s.data());
  EXPECT_EQ(s[1 * (K / G) + 0], 0.0f);
  EXPECT_FLOAT_EQ(s[2 * (K / G) + 1], 3.0f / 127.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < K / G; ++g) {
      const float scale = s[n * (K / G) + g];
      int max_q = 0;
      for (int64_t k = g * G; k < (g + 1) * G; ++k) {
        const int64_t i = n * K + k;
        max_q = std::max(max_q, std::abs(int(q[i])));
        EXPECT_LE(std::fabs(q[i] * scale - w[i]), 0.5f * scale * (1 + 1e-6f) + 1e-12f) << "n=" << n << " k=" << k;
      }
      if (scale > 0) {
        EXPECT_EQ(max_q, 127) << "n=" << n << " group " << g;
      }
    }
  }
  // The same values stored as bf16 quantize to the same result as their f32 widening.
  std::vector<uint16_t> h(N * K);
  std::vector<float> widened(N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    h[i] = f32_to_bf16(w[i]);
    widened[i] = bf16_to_f32(h[i]);
  }
  std::vector<int8_t> qa(N * K), qb(N * K);
  std::vector<float> sa(N * K / G), sb(N * K / G);
  quantize_int8(h.data(), DType::kBF16, N, K, G, qa.data(), sa.data());
  quantize_int8(widened.data(), DType::kF32, N, K, G, qb.data(), sb.data());
  EXPECT_EQ(qa, qb);
  EXPECT_EQ(sa, sb);
}

// The AVX-512 activation quantizer of the int8 dot-product kernels gives quantize_int8's
// bytes and scales exactly, ties (x exactly half a step) and an all-zero group included.
TEST(QuantizeInt8Test, Avx512RowQuantizerMatchesTheReferenceBitForBit) {
  if (detected_cpu_isa() < CpuIsa::kAvx512) GTEST_SKIP() << "SKIPPED: this CPU lacks AVX-512";
  for (const int64_t group : {32, 64, 96, 256}) {
    const int64_t K = group * 3;
    std::mt19937 rng(static_cast<uint32_t>(group));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> x(K);
    for (float& v : x) v = u(rng);
    x[0] = 127.0f;  // group 0's scale is exactly 1: these land on ties
    x[1] = 2.5f;
    x[2] = -3.5f;
    x[3] = 0.5f;
    for (int64_t k = group; k < 2 * group; ++k) x[k] = 0.0f;
    std::vector<int8_t> q_ref(K), q(K);
    std::vector<float> s_ref(3), s(3);
    quantize_int8(x.data(), DType::kF32, 1, K, group, q_ref.data(), s_ref.data());
    detail::quantize_row_int8_avx512(x.data(), K, group, q.data(), s.data());
    EXPECT_EQ(q, q_ref) << "group " << group;
    EXPECT_EQ(s, s_ref) << "group " << group;
    EXPECT_EQ(q[1], 2);
    EXPECT_EQ(q[2], -4);
  }
}

// The 16-bit x quantizers of the int8 GEMVs (AVX2 and AVX-512) give the scalar rule's values
// exactly: scale = max|x| / 32767, q = x / scale rounded half to even, ties included.
TEST(QuantizeInt8Test, Int16RowQuantizersMatchTheScalarRule) {
  for (const int64_t group : {32, 64, 96, 256}) {
    const int64_t K = group * 3;
    std::mt19937 rng(static_cast<uint32_t>(group) + 7);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    std::vector<float> x(K);
    for (float& v : x) v = u(rng);
    x[0] = 32767.0f;  // group 0's scale is exactly 1: these land on ties
    x[1] = 2.5f;
    x[2] = -3.5f;
    for (int64_t k = group; k < 2 * group; ++k) x[k] = 0.0f;
    std::vector<int16_t> q_ref(K);
    std::vector<float> s_ref(3);
    for (int64_t g = 0; g < 3; ++g) {
      float amax = 0.0f;
      for (int64_t k = 0; k < group; ++k) amax = std::max(amax, std::fabs(x[g * group + k]));
      s_ref[g] = amax / 32767.0f;
      for (int64_t k = 0; k < group; ++k) {
        const float v = s_ref[g] == 0.0f ? 0.0f : std::nearbyint(x[g * group + k] / s_ref[g]);
        q_ref[g * group + k] = static_cast<int16_t>(std::clamp(v, -32767.0f, 32767.0f));
      }
    }
    EXPECT_EQ(q_ref[1], 2);
    EXPECT_EQ(q_ref[2], -4);
    for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (isa > detected_cpu_isa()) continue;
      std::vector<int16_t> q(K);
      std::vector<float> s(3);
      if (isa == CpuIsa::kAvx2) {
        detail::quantize_row_int16_avx2(x.data(), K, group, q.data(), s.data());
      } else {
        detail::quantize_row_int16_avx512(x.data(), K, group, q.data(), s.data());
      }
      EXPECT_EQ(q, q_ref) << cpu_isa_name(isa) << " group " << group;
      EXPECT_EQ(s, s_ref) << cpu_isa_name(isa) << " group " << group;
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
