// The CPU 4-bit linear layer (kernels/cpu/linear_int4.h):
//  - packing: panels made from random ggml q4_0, q5_0, q4_1, q5_1, q4_K, q5_K and q6_K rows
//    decode to exactly ggml's own decoders' floats (common/gguf), and q4_0's rule applied to
//    decoded q4_0 weights gives the same panels back;
//  - arithmetic: every instruction-set flavour gives the scalar reference's bits, over shapes
//    that leave partial panels and every tile of rows, with bias and an activation;
//  - accuracy: the result is within the 8-bit activations' bound of the double-precision
//    product with the dequantized weights: per group, |x - xs xq| <= xs / 2 per element, so
//    |y - ref| <= sum over groups of (xs / 2) sum |w| (plus f32 rounding).
#include "kernels/cpu/linear_int4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/gguf/ggml_dequant.h"
#include "common/gguf/ggml_dequant_blocks.h"
#include "common/gguf/gguf_file.h"
#include "tests/kernels/int4_test_blocks.h"
#include "tests/kernels/isa_param_test.h"

namespace tessera::cpu {
namespace {

struct Packed {
  Int4Scheme scheme;
  int64_t N, K;
  std::vector<uint8_t> nibbles, scales;
  std::vector<float> w;  // what ggml's decoder makes of the same rows: [N, K]
};

Packed pack(Int4Scheme scheme, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  Packed p{scheme, N, K, std::vector<uint8_t>(static_cast<size_t>(int4_nibble_bytes(scheme, N, K)), 0xAA),
           std::vector<uint8_t>(static_cast<size_t>(int4_scale_bytes(scheme, N, K)), 0xAA),
           std::vector<float>(static_cast<size_t>(N * K))};
  const std::vector<uint8_t> rows = random_block_rows(rng, scheme, N, K);
  const BlockType bt = block_type_of(scheme);
  pack_int4_from_blocks(scheme, rows.data(), K / bt.elems * bt.bytes, N, K, p.nibbles.data(), p.scales.data());
  EXPECT_TRUE(dequantize_ggml(static_cast<uint32_t>(bt.type), rows.data(), N * K, p.w.data()).is_ok());
  return p;
}

std::vector<float> unpack(const Packed& p) {
  std::vector<float> out(p.w.size());
  dequantize_int4(p.scheme, p.nibbles.data(), p.scales.data(), p.N, p.K, out.data());
  return out;
}

TEST(Int4Packing, PanelsFromEveryBlockTypeDecodeToGgmlsOwnValues) {
  for (const Int4Scheme scheme : kAllSchemes) {
    for (const int64_t N : {1, 31, 32, 70}) {
      const Packed p = pack(scheme, N, 512, static_cast<uint32_t>(N));
      const std::vector<float> got = unpack(p);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], p.w[i]) << int4_scheme_name(scheme) << " N=" << N << " element " << i;
      }
    }
  }
}

TEST(Int4Packing, Q4_0RuleOnDecodedQ4_0GivesTheSamePanels) {
  const Packed p = pack(Int4Scheme::kSymmetric, 45, 256, 7);
  std::vector<uint8_t> nibbles(p.nibbles.size()), scales(p.scales.size());
  quantize_int4(p.w.data(), p.N, p.K, nibbles.data(), scales.data());
  // Groups whose scale is 0 decode to zeros whatever their nibbles: compare values.
  Packed again = p;
  again.nibbles = nibbles;
  again.scales = scales;
  const std::vector<float> got = unpack(again);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], p.w[i]) << "element " << i;
}

TEST(Int4Packing, QuantizeInt4StaysWithinHalfAStepOfEachWeight) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t N = 33, K = 96;
  std::vector<float> w(static_cast<size_t>(N * K));
  for (float& v : w) v = normal(rng);
  std::vector<uint8_t> nibbles(static_cast<size_t>(int4_nibble_bytes(Int4Scheme::kSymmetric, N, K)));
  std::vector<uint8_t> scales(static_cast<size_t>(int4_scale_bytes(Int4Scheme::kSymmetric, N, K)));
  quantize_int4(w.data(), N, K, nibbles.data(), scales.data());
  std::vector<float> back(w.size());
  dequantize_int4(Int4Scheme::kSymmetric, nibbles.data(), scales.data(), N, K, back.data());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < K / 32; ++g) {
      float amax = 0.0f;
      for (int64_t k = g * 32; k < g * 32 + 32; ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
      const float step = amax / 8.0f;
      for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
        // Half a step, except that q4_0 reaches only 7 steps on the side opposite the
        // largest value (q - 8 in [-8, 7]); plus the f16 rounding of the scale times the
        // largest |q - 8|.
        const float clipped = std::fabs(w[n * K + k]) - 7.0f * step;
        ASSERT_LE(std::fabs(back[n * K + k] - w[n * K + k]), std::max(0.5f * step, clipped) + 8.0f * step * 1e-3f)
            << "row " << n << " k " << k;
      }
    }
  }
}

class LinearInt4Test : public IsaParamTest {};

std::vector<float> run(CpuIsa isa, const Packed& p, const std::vector<float>& x, int64_t M, const float* bias,
                       Activation act) {
  std::vector<float> y(static_cast<size_t>(M * (p.N + 3)), std::nanf(""));
  linear_int4(Int4LinearOptions{isa}, p.scheme, x.data(), M, p.K, p.K, p.nibbles.data(), p.scales.data(), p.N,
              bias, y.data(), p.N + 3, act);
  return y;
}

TEST_P(LinearInt4Test, EqualsTheScalarReferenceAndTheFloatProductWithinTheActivationBound) {
  for (const Int4Scheme scheme : kAllSchemes) {
    for (const int64_t N : {5, 32, 70, 161}) {
      const int64_t K = 512;
      const Packed p = pack(scheme, N, K, static_cast<uint32_t>(N * 3 + 1));
      for (const int64_t M : {1, 2, 3, 4, 5, 9}) {
        std::mt19937 rng(static_cast<uint32_t>(M * 101 + N));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(M * K)), bias(static_cast<size_t>(N));
        for (float& v : x) v = u(rng);
        for (int64_t k = 64; k < 96; ++k) x[k] = 0.0f;  // an all-zero group of x
        for (float& v : bias) v = u(rng);
        const bool with_bias = M % 2 == 1;
        const Activation act = M == 3 ? Activation::kSilu : Activation::kNone;
        const std::vector<float> got = run(GetParam(), p, x, M, with_bias ? bias.data() : nullptr, act);
        const std::vector<float> ref = run(CpuIsa::kScalar, p, x, M, with_bias ? bias.data() : nullptr, act);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            const size_t i = static_cast<size_t>(m * (N + 3) + n);
            ASSERT_EQ(got[i], ref[i]) << int4_scheme_name(scheme) << " M=" << M << " N=" << N << " (" << m << ", "
                                      << n << ")";
            if (act != Activation::kNone) continue;
            double exact = with_bias ? bias[static_cast<size_t>(n)] : 0.0, bound = 0.0;
            for (int64_t g = 0; g < K / 32; ++g) {
              double amax = 0.0, wsum = 0.0;
              for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
                const double w = p.w[static_cast<size_t>(n * K + k)], xv = x[static_cast<size_t>(m * K + k)];
                exact += w * xv;
                amax = std::max(amax, std::fabs(xv));
                wsum += std::fabs(w);
              }
              bound += amax / 127.0 / 2.0 * wsum * 1.001 + 1e-6 * wsum;
            }
            ASSERT_NEAR(got[i], exact, bound) << int4_scheme_name(scheme) << " M=" << M << " N=" << N;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, LinearInt4Test, ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace tessera::cpu
