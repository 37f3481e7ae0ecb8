// The packed GEMM (kernels/cpu/gemm_packed.h) against a plain reference that computes each
// output as one ascending-k chain of fmaf over the same stored weights: the kernel promises
// exactly that chain whatever the blocking, so every element must match bit for bit —
// across row/column/K tails, K blocks, panel chunks, thread counts, bias and activations,
// padded rows, and weights packed once versus per call.
#include "kernels/cpu/gemm_packed.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "common/kernel_options.h"
#include "kernels/cpu/linear_cpu.h"

namespace tessera::cpu {
// Test names and failure messages print the instruction set by name.
inline void PrintTo(CpuIsa isa, std::ostream* os) { *os << cpu_isa_name(isa); }
}  // namespace tessera::cpu

namespace tessera::cpu::detail {
namespace {

struct GemmCase {
  int64_t M, K, N;
  bool bias;
  Activation act;
  bool padded;  // ldx > K and ldy > N
};

struct GemmData {
  std::vector<float> x, bias;
  std::vector<float> w_f32;
  std::vector<uint16_t> w_half;
  std::vector<float> w_exact;  // the stored weights, widened
  int64_t ldx = 0, ldy = 0;
  const void* w(DType dtype) const {
    return dtype == DType::kF32 ? static_cast<const void*>(w_f32.data()) : static_cast<const void*>(w_half.data());
  }
};

GemmData make_gemm_data(const GemmCase& c, DType dtype, std::mt19937& rng) {
  GemmData d;
  d.ldx = c.padded ? c.K + 3 : c.K;
  d.ldy = c.padded ? c.N + 5 : c.N;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // x's padding is NaN: a kernel that read it would poison its outputs.
  d.x.assign(static_cast<size_t>(c.M * d.ldx), std::numeric_limits<float>::quiet_NaN());
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t k = 0; k < c.K; ++k) d.x[m * d.ldx + k] = dist(rng);
  }
  d.w_exact.resize(static_cast<size_t>(c.N * c.K));
  if (dtype == DType::kF32) d.w_f32.resize(d.w_exact.size());
  else d.w_half.resize(d.w_exact.size());
  for (size_t i = 0; i < d.w_exact.size(); ++i) {
    const float v = dist(rng);
    if (dtype == DType::kF32) {
      d.w_f32[i] = d.w_exact[i] = v;
    } else if (dtype == DType::kF16) {
      d.w_half[i] = f32_to_f16(v);
      d.w_exact[i] = f16_to_f32(d.w_half[i]);
    } else {
      d.w_half[i] = f32_to_bf16(v);
      d.w_exact[i] = bf16_to_f32(d.w_half[i]);
    }
  }
  d.bias.resize(static_cast<size_t>(c.N));
  for (float& b : d.bias) b = dist(rng);
  return d;
}

std::vector<float> fma_chain_reference(const GemmCase& c, const GemmData& d) {
  std::vector<float> y(static_cast<size_t>(c.M * c.N));
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < c.K; ++k) acc = std::fmaf(d.x[m * d.ldx + k], d.w_exact[n * c.K + k], acc);
      y[m * c.N + n] = finish_output(acc, c.bias ? d.bias.data() : nullptr, n, c.act);
    }
  }
  return y;
}

std::string describe_gemm_case(const GemmCase& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) +
         " N=" + std::to_string(c.N) + " bias=" + std::to_string(c.bias) +
         " act=" + std::to_string(static_cast<int>(c.act)) + " padded=" + std::to_string(c.padded);
}

constexpr float kUntouched = -98765.25f;

// Runs the packed GEMM (per-call packing, or `prepacked`) and compares with the reference
// bit for bit; y's padding columns must stay untouched.
void expect_bit_exact(CpuIsa isa, const GemmCase& c, DType dtype, const GemmData& d, const std::vector<float>& ref,
                      const PackedWeights* prepacked, const std::string& how) {
  std::vector<float> y(static_cast<size_t>(c.M * d.ldy), kUntouched);
  const LinearArgs args{d.x.data(), c.M, c.K, d.ldx, d.w(dtype), dtype, c.N, c.bias ? d.bias.data() : nullptr,
                        y.data(), d.ldy, c.act};
  gemm_packed(isa, args, prepacked);
  int failures = 0;
  for (int64_t m = 0; m < c.M && failures < 5; ++m) {
    for (int64_t n = 0; n < d.ldy && failures < 5; ++n) {
      const float got = y[m * d.ldy + n];
      const float want = n < c.N ? ref[m * c.N + n] : kUntouched;
      if (std::memcmp(&got, &want, sizeof(float)) != 0) {
        ADD_FAILURE() << cpu_isa_name(isa) << " " << describe_gemm_case(c, dtype) << " " << how << ": y[" << m << "][" << n << "] = " << got << ", want "
                      << want;
        ++failures;
      }
    }
  }
}

// Each micro-kernel (AVX2, AVX-512) that this CPU can run, for each weight dtype.
class GemmPackedTest : public ::testing::TestWithParam<std::tuple<CpuIsa, DType>> {
 protected:
  void SetUp() override {
    if (isa() > detected_cpu_isa()) {
      GTEST_SKIP() << "this CPU cannot run the " << cpu_isa_name(isa()) << " micro-kernel (it has "
                   << cpu_isa_name(detected_cpu_isa()) << ")";
    }
  }
  CpuIsa isa() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(GemmPackedTest, BitExactOnAwkwardShapes) {
  const DType dtype = this->dtype();
  std::mt19937 rng(17 + static_cast<int>(dtype));
  const Activation acts[] = {Activation::kNone, Activation::kGeluTanh, Activation::kSilu};
  int index = 0;
  // M: below, at and past the 6- and 8-row tiles; K: below, at and past the 256-step K block
  // and the 8-step packing groups; N: below, at and past the 16- and 32-column panels and the
  // 256-column chunk.
  for (int64_t M : {2, 6, 7, 8, 13, 40}) {
    for (int64_t K : {1, 7, 8, 9, 255, 256, 257, 600}) {
      for (int64_t N : {1, 15, 16, 17, 31, 33, 257, 530}) {
        const GemmCase c{M, K, N, index % 2 == 0, acts[index % 3], index % 4 == 1};
        ++index;
        const GemmData d = make_gemm_data(c, dtype, rng);
        expect_bit_exact(isa(), c, dtype, d, fma_chain_reference(c, d), nullptr, "packed per call");
      }
    }
  }
}

TEST_P(GemmPackedTest, PrepackedWeightsGiveTheSameBits) {
  const DType dtype = this->dtype();
  std::mt19937 rng(5);
  for (const GemmCase& c : {GemmCase{9, 700, 300, true, Activation::kGeluTanh, true}, GemmCase{64, 1000, 1100, false, Activation::kNone, false}}) {
    const GemmData d = make_gemm_data(c, dtype, rng);
    const PackedWeights packed = PackedWeights::pack(isa(), WeightSource{d.w(dtype), dtype, c.N, c.K});
    EXPECT_EQ(packed.N(), c.N);
    EXPECT_EQ(packed.K(), c.K);
    const std::vector<float> ref = fma_chain_reference(c, d);
    expect_bit_exact(isa(), c, dtype, d, ref, &packed, "prepacked");
    expect_bit_exact(isa(), c, dtype, d, ref, nullptr, "packed per call");
  }
}

// Threads split the panels; the result must not depend on how many there are.
TEST_P(GemmPackedTest, SameBitsOnOneThreadAndAll) {
  const DType dtype = this->dtype();
  std::mt19937 rng(11);
  const GemmCase c{50, 513, 1000, true, Activation::kSilu, false};
  const GemmData d = make_gemm_data(c, dtype, rng);
  const std::vector<float> ref = fma_chain_reference(c, d);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  expect_bit_exact(isa(), c, dtype, d, ref, nullptr, "1 thread");
  omp_set_num_threads(std::max(saved, 2));
  expect_bit_exact(isa(), c, dtype, d, ref, nullptr, "2+ threads");
  omp_set_num_threads(saved);
}

// The linear front routes M above the GEMV rows to the packed GEMM when asked, and the
// result is the same bits as calling it directly.
TEST_P(GemmPackedTest, LinearFrontUsesIt) {
  const DType dtype = this->dtype();
  std::mt19937 rng(3);
  const GemmCase c{33, 300, 200, true, Activation::kNone, false};
  const GemmData d = make_gemm_data(c, dtype, rng);
  LinearOptions options;
  options.isa = isa();
  options.path = LinearPath::kGemm;
  options.gemm = GemmKernel::kPacked;
  options.bf16_dot = false;
  std::vector<float> y(static_cast<size_t>(c.M * c.N));
  linear_with(options, d.x.data(), c.M, c.K, c.K, d.w(dtype), dtype, c.N, d.bias.data(), y.data(), c.N, c.act);
  const std::vector<float> ref = fma_chain_reference(c, d);
  EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)));
}

// By default (CpuKernelOptions{}: bf16_dot on) bf16 weights past the GEMV rows take the bf16
// dot kernel where the CPU has AVX512_BF16, and keep the f32 FMA chain elsewhere.
TEST(GemmPackedDefaults, Bf16WeightsTakeTheBf16DotKernelWhereTheCpuHasIt) {
  if (!gemm_packed_supported(detected_cpu_isa())) GTEST_SKIP() << "no packed GEMM kernel on this CPU";
  std::mt19937 rng(4);
  const GemmCase c{33, 300, 200, true, Activation::kNone, false};
  const GemmData d = make_gemm_data(c, DType::kBF16, rng);
  std::vector<float> y(static_cast<size_t>(c.M * c.N)), want(y.size());
  linear(d.x.data(), c.M, c.K, c.K, d.w(DType::kBF16), DType::kBF16, c.N, d.bias.data(), y.data(), c.N, c.act);
  const LinearArgs args{d.x.data(), c.M, c.K, c.K, d.w(DType::kBF16), DType::kBF16, c.N, d.bias.data(), want.data(),
                        c.N, c.act};
  gemm_packed(detected_cpu_isa(), args, nullptr, /*bf16_dot=*/true);
  if (!cpu_has_bf16_dot() || detected_cpu_isa() != CpuIsa::kAvx512) {
    want = fma_chain_reference(c, d);
    std::cout << "NOTE: no AVX512_BF16 here; checked that bf16 weights keep f32 arithmetic\n";
  }
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
}

// bf16_dot off (worker.cpu.bf16_dot: false, TESSERA_CPU_BF16_DOT=0), in the same process as
// the default above: the same call keeps the f32 FMA chain, bit for bit.
TEST(GemmPackedDefaults, Bf16DotOffKeepsTheF32FmaChain) {
  if (!gemm_packed_supported(detected_cpu_isa())) GTEST_SKIP() << "no packed GEMM kernel on this CPU";
  std::mt19937 rng(4);
  const GemmCase c{33, 300, 200, true, Activation::kNone, false};
  const GemmData d = make_gemm_data(c, DType::kBF16, rng);
  CpuKernelOptions off;
  off.bf16_dot = false;
  std::vector<float> y(static_cast<size_t>(c.M * c.N));
  linear_with(linear_options(off), d.x.data(), c.M, c.K, c.K, d.w(DType::kBF16), DType::kBF16, c.N, d.bias.data(),
              y.data(), c.N, c.act);
  const std::vector<float> want = fma_chain_reference(c, d);
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(AllKernelsAndWeightDtypes, GemmPackedTest,
                         ::testing::Combine(::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(cpu_isa_name(std::get<0>(info.param))) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

// int8 weights: each K block is dequantized (q * scale in f32) as it is packed, so the
// result is the FMA chain over the dequantized weights, bit for bit, across group and K
// block boundaries and both tile shapes.
class GemmPackedInt8Test : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(GemmPackedInt8Test, BitExactOverDequantizedWeights) {
  const CpuIsa isa = GetParam();
  if (isa > detected_cpu_isa()) GTEST_SKIP() << "this CPU cannot run the " << cpu_isa_name(isa) << " micro-kernel";
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::uniform_int_distribution<int> qdist(-127, 127);
  for (const GemmCase& c : {GemmCase{17, 64, 33, true, Activation::kSilu, false}, GemmCase{40, 608, 530, false, Activation::kNone, true},
                            GemmCase{9, 256, 16, true, Activation::kGeluTanh, true}}) {
    for (int64_t group : {32, 64}) {
      if (c.K % group != 0) continue;
      const int64_t ldx = c.padded ? c.K + 3 : c.K, ldy = c.padded ? c.N + 5 : c.N, groups = c.K / group;
      std::vector<float> x(static_cast<size_t>(c.M * ldx)), bias(static_cast<size_t>(c.N));
      for (float& v : x) v = dist(rng);
      for (float& v : bias) v = dist(rng);
      std::vector<int8_t> q(static_cast<size_t>(c.N * c.K));
      std::vector<float> scales(static_cast<size_t>(c.N * groups));
      for (int8_t& v : q) v = static_cast<int8_t>(qdist(rng));
      for (float& v : scales) v = dist(rng) * 0.01f;
      std::vector<float> ref(static_cast<size_t>(c.M * c.N));
      for (int64_t m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < c.N; ++n) {
          float acc = 0.0f;
          for (int64_t k = 0; k < c.K; ++k) {
            const float w = static_cast<float>(q[n * c.K + k]) * scales[n * groups + k / group];
            acc = std::fmaf(x[m * ldx + k], w, acc);
          }
          ref[m * c.N + n] = finish_output(acc, c.bias ? bias.data() : nullptr, n, c.act);
        }
      }
      std::vector<float> y(static_cast<size_t>(c.M * ldy), kUntouched);
      const LinearArgs args{x.data(), c.M, c.K, ldx, q.data(), DType::kI8, c.N, c.bias ? bias.data() : nullptr,
                            y.data(), ldy, c.act};
      gemm_packed_int8(isa, args, scales.data(), group);
      int failures = 0;
      for (int64_t m = 0; m < c.M && failures < 5; ++m) {
        for (int64_t n = 0; n < ldy && failures < 5; ++n) {
          const float got = y[m * ldy + n], want = n < c.N ? ref[m * c.N + n] : kUntouched;
          if (std::memcmp(&got, &want, sizeof(float)) != 0) {
            ADD_FAILURE() << cpu_isa_name(isa) << " int8 group " << group << " M=" << c.M << " K=" << c.K << " N=" << c.N
                          << ": y[" << m << "][" << n << "] = " << got << ", want " << want;
            ++failures;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothKernels, GemmPackedInt8Test, ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

// The bf16 dot arithmetic's reference: a double sum over x rounded to bf16 (as the kernels
// round it) times the exact weights, within f32 summation error of the products' magnitude;
// columns past N untouched.
void expect_bf16_rounded_reference(const GemmCase& c, const GemmData& d, const std::vector<float>& y) {
  int failures = 0;
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < d.ldy; ++n) {
      const float got = y[m * d.ldy + n];
      if (n >= c.N) {
        EXPECT_EQ(got, kUntouched);
        continue;
      }
      double acc = 0, magnitude = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = static_cast<double>(bf16_to_f32(f32_to_bf16(d.x[m * d.ldx + k]))) * d.w_exact[n * c.K + k];
        acc += p;
        magnitude += std::fabs(p);
      }
      const double want = finish_output(static_cast<float>(acc), c.bias ? d.bias.data() : nullptr, n, c.act);
      if (std::fabs(got - want) > 2e-6 * magnitude + 1e-6 && failures++ < 5) {
        ADD_FAILURE() << describe_gemm_case(c, DType::kBF16) << ": y[" << m << "][" << n << "] = " << got << ", want " << want;
      }
    }
  }
}

// The bf16 dot-product kernel (bf16_dot): x rounded to bf16, pairs of k per vdpbf16ps. Not a
// plain fmaf chain any more (two products per instruction), so it is compared with a double
// reference over the same rounded x within f32 summation error; odd K keeps the f32 kernel.
TEST(GemmPackedBf16Dot, MatchesTheReferenceOfBf16RoundedX) {
  if (!cpu_has_bf16_dot()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937 rng(31);
  for (const GemmCase& c : {GemmCase{8, 256, 32, false, Activation::kNone, false}, GemmCase{37, 600, 530, true, Activation::kSilu, true},
                            GemmCase{64, 2048, 96, false, Activation::kNone, false}}) {
    const GemmData d = make_gemm_data(c, DType::kBF16, rng);
    std::vector<float> y(static_cast<size_t>(c.M * d.ldy), kUntouched);
    const LinearArgs args{d.x.data(), c.M, c.K, d.ldx, d.w(DType::kBF16), DType::kBF16, c.N, c.bias ? d.bias.data() : nullptr,
                          y.data(), d.ldy, c.act};
    gemm_packed(CpuIsa::kAvx512, args, nullptr, /*bf16_dot=*/true);
    expect_bf16_rounded_reference(c, d, y);
    // Rounding x to bf16 must show: the plain f32 kernel's answer differs somewhere.
    std::vector<float> y32(static_cast<size_t>(c.M * d.ldy), kUntouched);
    const LinearArgs args32{d.x.data(), c.M, c.K, d.ldx, d.w(DType::kBF16), DType::kBF16, c.N, c.bias ? d.bias.data() : nullptr,
                            y32.data(), d.ldy, c.act};
    gemm_packed(CpuIsa::kAvx512, args32);
    EXPECT_NE(0, std::memcmp(y.data(), y32.data(), y.size() * sizeof(float))) << describe_gemm_case(c, DType::kBF16);
  }
  // Odd K: the pairs do not line up, so the f32 kernel runs (bit-exact with the fmaf chain).
  const GemmCase odd{9, 301, 40, false, Activation::kNone, false};
  const GemmData d = make_gemm_data(odd, DType::kBF16, rng);
  std::vector<float> y(static_cast<size_t>(odd.M * d.ldy));
  const LinearArgs args{d.x.data(), odd.M, odd.K, d.ldx, d.w(DType::kBF16), DType::kBF16, odd.N, nullptr, y.data(), d.ldy, odd.act};
  gemm_packed(CpuIsa::kAvx512, args, nullptr, /*bf16_dot=*/true);
  const std::vector<float> ref = fma_chain_reference(odd, d);
  EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)));
}

TEST(GemmPacked, NoKernelForScalarFlavour) { EXPECT_FALSE(gemm_packed_supported(CpuIsa::kScalar)); }

}  // namespace
}  // namespace tessera::cpu::detail

namespace tessera::cpu::detail {
namespace {

// The batched-decode kernel of the bf16 dot arithmetic (gemv_bf16_dot): weights read in place,
// x rounded to bf16 as the packed kernel rounds it. Compared with a double reference over the
// rounded x within f32 summation error, over row counts around its 8-row tile, K tails of
// every length class, bias and activations, padded rows; and linear() routes 2..16-row bf16
// calls to it where the CPU has AVX512_BF16.
TEST(GemvBf16Dot, MatchesTheReferenceOfBf16RoundedX) {
  if (!cpu_has_bf16_dot()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937 rng(41);
  for (const GemmCase& c : {GemmCase{2, 96, 50, true, Activation::kNone, false},
                            GemmCase{3, 64, 31, false, Activation::kSilu, true},
                            GemmCase{4, 130, 64, true, Activation::kNone, false},
                            GemmCase{5, 256, 40, false, Activation::kNone, false},
                            GemmCase{8, 300, 33, true, Activation::kSilu, true},
                            GemmCase{13, 33, 130, true, Activation::kNone, false},
                            GemmCase{16, 1000, 70, false, Activation::kGeluTanh, true},
                            GemmCase{9, 1, 17, true, Activation::kNone, true}}) {
    const GemmData d = make_gemm_data(c, DType::kBF16, rng);
    std::vector<float> y(static_cast<size_t>(c.M * d.ldy), kUntouched);
    const LinearArgs args{d.x.data(), c.M, c.K, d.ldx, d.w(DType::kBF16), DType::kBF16, c.N, c.bias ? d.bias.data() : nullptr,
                          y.data(), d.ldy, c.act};
    gemv_bf16_dot(args);
    expect_bf16_rounded_reference(c, d, y);
    // linear() takes this kernel for these row counts (same bits).
    std::vector<float> routed(y.size(), kUntouched);
    LinearOptions options;
    options.bf16_dot = true;
    linear_with(options, d.x.data(), c.M, c.K, d.ldx, d.w(DType::kBF16), DType::kBF16, c.N, c.bias ? d.bias.data() : nullptr,
                routed.data(), d.ldy, c.act);
    if (detected_cpu_isa() == CpuIsa::kAvx512) {
      EXPECT_EQ(0, std::memcmp(routed.data(), y.data(), y.size() * sizeof(float))) << describe_gemm_case(c, DType::kBF16);
    }
  }
}

}  // namespace
}  // namespace tessera::cpu::detail
