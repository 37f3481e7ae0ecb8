// Coded bf16 weights (kernels/coded_bf16_layout.h, kernels/coded_bf16.h,
// kernels/cpu/linear_coded_bf16.h):
//  - coding is lossless: any bf16 matrix (Gaussian rows with outliers, zeros of both signs,
//    subnormals, inf, NaN) decodes to its own bits, and a Gaussian matrix takes 3/4 of its
//    bf16 bytes with escapes under 1e-3 of its weights;
//  - the linear layer on the coded form gives the bf16 linear layer's result on the matrix
//    it holds: within f32 summation error of the double-precision product with x rounded to
//    bf16 (the bf16 dot products' rounding) on every flavour and both paths (the coded GEMV
//    up to 16 rows of x, decoded chunks beyond), with bias and an activation, escapes included;
//  - a row of x gives the same bits whatever else is in the batch (the GEMV's tiles).
#include "kernels/cpu/linear_coded_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/coded_bf16.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/gemm_packed.h"
#include "tests/kernels/isa_param_test.h"

namespace tessera::cpu {
namespace {

// An [N, K] bf16 matrix of rows with their own scale (2^-9 .. 2^-3), a few far outliers, and
// with `specials` some zeros, negative zeros, subnormals, infinities and NaNs.
std::vector<uint16_t> test_matrix(int64_t N, int64_t K, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale_exp(-9, -3);
  std::uniform_int_distribution<int64_t> column(0, K - 1);
  std::vector<uint16_t> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    const float scale = std::ldexp(1.0f, scale_exp(rng));
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = f32_to_bf16(normal(rng) * scale);
    w[n * K + column(rng)] = f32_to_bf16(scale * 3000.0f);  // an outlier past the window
    if (!specials) continue;
    w[n * K + column(rng)] = 0x0000;
    w[n * K + column(rng)] = 0x8000;
    w[n * K + column(rng)] = 0x0001;  // the smallest subnormal
    w[n * K + column(rng)] = 0x80ff;
    if (n % 3 == 0) w[n * K + column(rng)] = 0x7f80;  // +inf
    if (n % 5 == 0) w[n * K + column(rng)] = 0x7fc1;  // a NaN with a payload
  }
  return w;
}

CodedBf16Matrix code(const std::vector<uint16_t>& w, int64_t N, int64_t K) {
  return encode_coded_bf16(w.data(), N, K);
}

TEST(CodedBf16, DecodesToTheSameBits) {
  for (int64_t K : {64, 192, 2048}) {
    const int64_t N = 37;
    const std::vector<uint16_t> w = test_matrix(N, K, static_cast<uint32_t>(K), /*specials=*/true);
    const CodedBf16Matrix c = code(w, N, K);
    ASSERT_EQ(c.body.dim(1), K / 64 * 96);
    std::vector<uint16_t> back(w.size(), 0x1234);
    decode_coded_bf16_rows(c.body.data<uint8_t>(), c.side.data<int32_t>(), N, c.side.numel(), K, 0, N, 0, K, back.data());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(back[i], w[i]) << "K=" << K << " element " << i;
    // A later slice of rows and inputs decodes alone.
    const int64_t k0 = K > 64 ? 64 : 0, width = K - k0;
    std::vector<uint16_t> part(static_cast<size_t>(5 * width));
    decode_coded_bf16_rows(c.body.data<uint8_t>(), c.side.data<int32_t>(), N, c.side.numel(), K, 30, 35, k0, K,
                           part.data());
    for (int64_t r = 0; r < 5; ++r) {
      for (int64_t k = 0; k < width; ++k) ASSERT_EQ(part[r * width + k], w[(30 + r) * K + k0 + k]) << "slice " << r << ", " << k;
    }
  }
}

TEST(CodedBf16, ThePortableAndTheSimdEncoderWriteTheSameBytes) {
  const int64_t N = 41, K = 320;
  const std::vector<uint16_t> w = test_matrix(N, K, 5, /*specials=*/true);
  const CodedBf16Matrix portable = encode_coded_bf16_with(w.data(), N, K, nullptr, /*simd=*/false);
  const CodedBf16Matrix simd = encode_coded_bf16_with(w.data(), N, K, nullptr, /*simd=*/true);
  ASSERT_EQ(portable.side.numel(), simd.side.numel());
  EXPECT_EQ(std::memcmp(portable.body.data<uint8_t>(), simd.body.data<uint8_t>(), portable.body.nbytes()), 0);
  EXPECT_EQ(std::memcmp(portable.side.data<int32_t>(), simd.side.data<int32_t>(), portable.side.nbytes()), 0);
}

TEST(CodedBf16, GaussianRowsTakeThreeQuartersOfTheBytesWithFewEscapes) {
  const int64_t N = 256, K = 2048;
  std::vector<uint16_t> w = test_matrix(N, K, 7, /*specials=*/false);
  const CodedBf16Matrix c = code(w, N, K);
  const CodedBf16Side side = CodedBf16Side::of(N, c.side.numel());
  // One outlier per row, by construction, plus the Gaussian's own tail below the window.
  EXPECT_GE(side.escapes, N);
  EXPECT_LT(static_cast<double>(side.escapes) / static_cast<double>(N * K), 1e-3) << side.escapes << " escapes";
  const double bytes = static_cast<double>(c.body.nbytes() + c.side.nbytes());
  EXPECT_LT(bytes / static_cast<double>(N * K * 2), 0.76);
}

// The double-precision reference: x (rounded to bf16 where the bf16 dot products round it)
// times the exact weights; the bound is f32 summation error over sum |x w|.
void reference(const std::vector<float>& x, int64_t M, int64_t K, const std::vector<uint16_t>& w, int64_t N,
               const std::vector<float>& bias, Activation act, bool round_x, std::vector<double>* y,
               std::vector<double>* bound) {
  y->assign(static_cast<size_t>(M * N), 0.0);
  bound->assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float xv = round_x ? bf16_to_f32(f32_to_bf16(x[m * K + k])) : x[m * K + k];
        const double p = static_cast<double>(xv) * bf16_to_f32(w[n * K + k]);
        s += p;
        a += std::fabs(p);
      }
      s += bias.empty() ? 0.0 : bias[n];
      (*y)[m * N + n] = activate(static_cast<float>(s), act);
      (*bound)[m * N + n] = 1e-6 + 2e-6 * a * (1 + std::log2(static_cast<double>(K)));
    }
  }
}

// A coded table's rows come back as the bf16 table's, through the CPU backend's lookup: the
// whole vocabulary, and a vocabulary-parallel rank's rows (zeros for the other rank's ids).
TEST(CodedBf16, EmbeddingLooksUpTheTablesRows) {
  const int64_t V = 50, H = 128;
  const std::vector<uint16_t> w = test_matrix(V, H, 9, /*specials=*/false);
  const CodedBf16Matrix c = code(w, V, H);
  auto backend = make_backend("cpu");
  ASSERT_TRUE(backend.is_ok());
  Tensor table = Tensor::zeros({V, H}, DType::kBF16);
  std::memcpy(table.data<uint16_t>(), w.data(), w.size() * 2);
  Tensor ids = Tensor::zeros({4}, DType::kI32);
  const int32_t picked[] = {0, 49, 7, 23};
  std::memcpy(ids.data<int32_t>(), picked, sizeof picked);
  Tensor want = Tensor::zeros({4, H}, DType::kF32), got = Tensor::zeros({4, H}, DType::kF32);
  backend.value()->embedding(ids.view(), table.view(), want.view());
  backend.value()->embedding_coded_bf16(ids.view(), c.body.view(), c.side.view(), got.view());
  EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), 4 * H * sizeof(float)), 0);
  // Rank 1 of 2 holds rows [25, 50): ids 0 and 7 are another rank's.
  const CodedBf16Matrix half = encode_coded_bf16(w.data() + 25 * H, 25, H);
  Tensor rank_half = Tensor::zeros({25, H}, DType::kBF16);
  std::memcpy(rank_half.data<uint16_t>(), w.data() + 25 * H, 25 * H * 2);
  backend.value()->embedding(ids.view(), rank_half.view(), want.view(), 25);
  backend.value()->embedding_coded_bf16(ids.view(), half.body.view(), half.side.view(), got.view(), 25);
  EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), 4 * H * sizeof(float)), 0);
  EXPECT_EQ(got.data<float>()[0], 0.0f);
}

class CodedBf16Linear : public IsaParamTest {};

TEST_P(CodedBf16Linear, MatchesTheBf16ProductOnBothPaths) {
  struct Shape {
    int64_t M, K, N;
  };
  for (Shape s : {Shape{1, 64, 1}, Shape{1, 2048, 300}, Shape{2, 192, 77}, Shape{5, 640, 129}, Shape{8, 256, 64},
                  Shape{9, 128, 50}, Shape{16, 512, 33}, Shape{17, 320, 100}, Shape{64, 256, 70}}) {
    const std::vector<uint16_t> w = test_matrix(s.N, s.K, static_cast<uint32_t>(s.M * 7 + s.N), /*specials=*/false);
    const CodedBf16Matrix c = code(w, s.N, s.K);
    std::mt19937 rng(static_cast<uint32_t>(s.K));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(s.M * s.K)), bias(static_cast<size_t>(s.N));
    for (float& v : x) v = u(rng);
    for (float& v : bias) v = u(rng);
    for (const bool with_bias : {false, true}) {
      for (const Activation act : {Activation::kNone, Activation::kSilu}) {
        const std::vector<float> b = with_bias ? bias : std::vector<float>{};
        // Every path rounds x to bf16 where the CPU has bf16 dot products, and none does elsewhere.
        const bool round_x = GetParam() == CpuIsa::kAvx512 && detail::cpu_has_bf16_dot();
        std::vector<double> ref, bound;
        reference(x, s.M, s.K, w, s.N, b, act, round_x, &ref, &bound);
        for (const detail::LinearPath path : {detail::LinearPath::kAuto, detail::LinearPath::kGemm}) {
          detail::LinearOptions o;
          o.isa = GetParam();
          o.path = path;
          std::vector<float> y(static_cast<size_t>(s.M * s.N), std::nanf(""));
          linear_coded_bf16(o, x.data(), s.M, s.K, s.K, c.body.data<uint8_t>(), c.side.data<int32_t>(),
                            c.side.numel(), s.N, with_bias ? b.data() : nullptr, y.data(), s.N, act);
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_NEAR(y[i], ref[i], bound[i] * (act == Activation::kSilu ? 1.2 : 1.0))
                << "M=" << s.M << " K=" << s.K << " N=" << s.N << " bias=" << with_bias
                << " silu=" << (act == Activation::kSilu) << " gemv=" << detail::coded_bf16_gemv_runs(o, s.M)
                << " element " << i;
          }
        }
      }
    }
  }
}

TEST_P(CodedBf16Linear, ARowGivesTheSameBitsInAnyBatch) {
  const int64_t K = 1024, N = 96;
  const std::vector<uint16_t> w = test_matrix(N, K, 11, /*specials=*/false);
  const CodedBf16Matrix c = code(w, N, K);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(16 * K));
  for (float& v : x) v = u(rng);
  detail::LinearOptions o;
  o.isa = GetParam();
  // The decoded-chunk path is the bf16 linear layer's, which makes no such promise.
  if (!detail::coded_bf16_gemv_runs(o, 16)) GTEST_SKIP() << "SKIPPED: no coded GEMV on " << cpu_isa_name(GetParam()) << " here";
  std::vector<float> alone(static_cast<size_t>(N));
  linear_coded_bf16(o, x.data() + 5 * K, 1, K, K, c.body.data<uint8_t>(), c.side.data<int32_t>(), c.side.numel(), N,
                    nullptr, alone.data(), N, Activation::kNone);
  for (const int64_t M : {6, 9, 16}) {
    std::vector<float> batch(static_cast<size_t>(M * N));
    linear_coded_bf16(o, x.data(), M, K, K, c.body.data<uint8_t>(), c.side.data<int32_t>(), c.side.numel(), N,
                      nullptr, batch.data(), N, Activation::kNone);
    EXPECT_EQ(std::memcmp(alone.data(), batch.data() + 5 * N, N * sizeof(float)), 0) << "row 5 of a batch of " << M;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CodedBf16Linear, ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace tessera::cpu
