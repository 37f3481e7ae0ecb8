// Parity of the CPU linear layer with a plain double-precision reference, over awkward
// shapes, every weight dtype, every instruction-set flavour this CPU has and both regimes
// (GEMV, OpenBLAS sgemm and the packed GEMM), with and without bias and gelu, with padded x
// and y rows.
//
// Tolerance, per element: |y - ref| <= 1e-5 * sqrt(K) * max|x| * max|w| + 1e-6 * |ref|.
// The first term covers f32 accumulation in any order (rounding errors of K partial sums
// grow like sqrt(K) when they are independent); the second covers the f32 gelu. f16/bf16
// weights are compared against the reference computed from the same rounded weights, so
// the tolerance does not depend on the weight dtype.
#include "kernels/cpu/linear_cpu.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/kernel_options.h"
#include "kernels/cpu/gemm_packed.h"

namespace tessera {
// Test names and failure messages print the dtype's name, not its bytes.
inline void PrintTo(DType dtype, std::ostream* os) { *os << dtype_name(dtype); }
}  // namespace tessera

namespace tessera::cpu {
namespace {

using detail::linear_options;
using detail::LinearOptions;
using detail::LinearPath;
using detail::packed_gemm_preferred;

double gelu_ref(double v) {
  return v * 0.5 * (1.0 + std::tanh(0.79788456 * v * (1.0 + 0.044715 * v * v)));
}

// Weights of one dtype plus their exact f32 values (what the kernel must compute with).
struct Weights {
  DType dtype;
  std::vector<float> f32;         // used when dtype == kF32
  std::vector<uint16_t> half;     // f16 or bf16 bits
  std::vector<float> exact;       // the stored values, widened
  const void* data() const { return dtype == DType::kF32 ? static_cast<const void*>(f32.data())
                                                        : static_cast<const void*>(half.data()); }
};

Weights make_weights(DType dtype, int64_t N, int64_t K, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  Weights w{dtype, {}, {}, {}};
  w.exact.resize(N * K);
  if (dtype == DType::kF32) w.f32.resize(N * K);
  else w.half.resize(N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    float v = dist(rng);
    if (dtype == DType::kF32) {
      w.f32[i] = v;
      w.exact[i] = v;
    } else if (dtype == DType::kF16) {
      w.half[i] = f32_to_f16(v);
      w.exact[i] = f16_to_f32(w.half[i]);
    } else {
      w.half[i] = f32_to_bf16(v);
      w.exact[i] = bf16_to_f32(w.half[i]);
    }
  }
  return w;
}

struct Shape {
  int64_t M, K, N;
};

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa <= detected_cpu_isa()) isas.push_back(isa);
  }
  return isas;
}

// Runs every flavour x regime x (bias, gelu) combination on one shape and checks it.
void check_shape(DType dtype, const Shape& s, bool padded, std::mt19937& rng, int variant_seed) {
  const int64_t ldx = padded ? s.K + 5 : s.K;
  const int64_t ldy = padded ? s.N + 3 : s.N;
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  // x's padding is NaN: reading it would poison the result.
  std::vector<float> x(s.M * ldx, std::numeric_limits<float>::quiet_NaN());
  float max_x = 0;
  for (int64_t m = 0; m < s.M; ++m) {
    for (int64_t k = 0; k < s.K; ++k) {
      x[m * ldx + k] = dist(rng);
      max_x = std::max(max_x, std::fabs(x[m * ldx + k]));
    }
  }
  Weights w = make_weights(dtype, s.N, s.K, rng);
  float max_w = 0;
  for (float v : w.exact) max_w = std::max(max_w, std::fabs(v));
  std::vector<float> bias(s.N);
  for (float& b : bias) b = dist(rng);

  std::vector<double> dot(s.M * s.N);
  for (int64_t m = 0; m < s.M; ++m) {
    for (int64_t n = 0; n < s.N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < s.K; ++k) {
        acc += static_cast<double>(x[m * ldx + k]) * static_cast<double>(w.exact[n * s.K + k]);
      }
      dot[m * s.N + n] = acc;
    }
  }
  const double scale_tol = 1e-5 * std::sqrt(static_cast<double>(s.K)) * max_x * max_w;

  const float kSentinel = -12345.5f;
  int variant = variant_seed;
  for (CpuIsa isa : available_isas()) {
    // The GEMM regime once per GEMM kernel this flavour has (OpenBLAS; the packed GEMM).
    struct Route {
      LinearPath path;
      detail::GemmKernel gemm;
    };
    std::vector<Route> routes = {{LinearPath::kGemv, detail::GemmKernel::kAuto},
                                 {LinearPath::kGemm, detail::GemmKernel::kOpenBlas},
                                 {LinearPath::kAuto, detail::GemmKernel::kAuto}};
    if (isa >= CpuIsa::kAvx2) routes.push_back({LinearPath::kGemm, detail::GemmKernel::kPacked});
    for (const Route& route : routes) {
      const LinearPath path = route.path;
      const bool with_bias = (variant & 1) != 0;
      const bool gelu = (variant & 2) != 0;
      ++variant;
      LinearOptions options;
      options.isa = isa;
      options.path = path;
      options.gemm = route.gemm;
      options.bf16_dot = false;  // f32 arithmetic; the bf16 dot kernel has its own reference (gemm_packed_test)
      std::vector<float> y(s.M * ldy, kSentinel);
      detail::linear_with(options, x.data(), s.M, s.K, ldx, w.data(), dtype, s.N,
                          with_bias ? bias.data() : nullptr, y.data(), ldy, gelu ? Activation::kGeluTanh : Activation::kNone);
      const std::string what = std::string(dtype_name(dtype)) + " M=" + std::to_string(s.M) +
                               " K=" + std::to_string(s.K) + " N=" + std::to_string(s.N) +
                               " isa=" + cpu_isa_name(isa) + " path=" +
                               std::to_string(static_cast<int>(path)) +
                               " gemm=" + std::to_string(static_cast<int>(route.gemm)) +
                               " bias=" + std::to_string(with_bias) + " gelu=" +
                               std::to_string(gelu) + " padded=" + std::to_string(padded);
      int failures = 0;
      for (int64_t m = 0; m < s.M && failures < 5; ++m) {
        for (int64_t n = 0; n < ldy; ++n) {
          const float got = y[m * ldy + n];
          if (n >= s.N) {  // beyond N: never written
            if (std::memcmp(&got, &kSentinel, sizeof(float)) != 0) {
              ADD_FAILURE() << what << ": wrote padding y[" << m << "][" << n << "] = " << got;
              ++failures;
            }
            continue;
          }
          double ref = dot[m * s.N + n] + (with_bias ? bias[n] : 0.0);
          if (gelu) ref = gelu_ref(ref);
          const double tol = scale_tol + 1e-6 * std::fabs(ref);
          if (!(std::fabs(got - ref) <= tol)) {
            ADD_FAILURE() << what << ": y[" << m << "][" << n << "] = " << got << ", reference "
                          << ref << ", tolerance " << tol;
            ++failures;
          }
        }
      }
    }
  }
}

class LinearCpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearCpuTest, MatchesDoubleReferenceOnAwkwardShapes) {
  const DType dtype = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(dtype));
  int index = 0;
  for (int64_t M : {1, 2, 3, 7, 8, 9, 33, 128}) {
    for (int64_t K : {1, 3, 17, 61, 100, 343, 1000}) {
      for (int64_t N : {1, 3, 17, 61, 100, 343}) {
        check_shape(dtype, {M, K, N}, /*padded=*/index % 2 == 1, rng, index);
        ++index;
      }
    }
  }
}

// Wide enough that the sgemm regime widens several panels per thread and the GEMV splits
// N unevenly across threads.
TEST_P(LinearCpuTest, ManyPanels) {
  const DType dtype = GetParam();
  std::mt19937 rng(99);
  check_shape(dtype, {33, 1000, 1100}, /*padded=*/true, rng, 0);
  check_shape(dtype, {4, 4099, 515}, /*padded=*/false, rng, 3);
}

// The GEMM threading policies must agree with each other (and the reference).
TEST_P(LinearCpuTest, BothGemmThreadingPolicies) {
  const DType dtype = GetParam();
  std::mt19937 rng(7);
  const int64_t M = 40, K = 300, N = 530;
  std::vector<float> x(M * K);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  Weights w = make_weights(dtype, N, K, rng);
  std::vector<float> bias(N, 0.25f);
  std::vector<float> y_blas(M * N), y_omp(M * N);
  LinearOptions options;
  options.path = LinearPath::kGemm;
  options.gemm = detail::GemmKernel::kOpenBlas;  // the policies are OpenBLAS's
  options.threading = detail::GemmThreading::kBlasThreads;
  detail::linear_with(options, x.data(), M, K, K, w.data(), dtype, N, bias.data(), y_blas.data(),
                      N, Activation::kGeluTanh);
  options.threading = detail::GemmThreading::kOmpPanels;
  detail::linear_with(options, x.data(), M, K, K, w.data(), dtype, N, bias.data(), y_omp.data(),
                      N, Activation::kGeluTanh);
  for (int64_t i = 0; i < M * N; ++i) {
    ASSERT_NEAR(y_blas[i], y_omp[i], 1e-5 * std::sqrt(K) * 1.0 * 0.5 + 1e-6) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightDtypes, LinearCpuTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LinearCpu, ReportsIsaFlavours) {
  EXPECT_LE(linear_options(CpuKernelOptions{}).isa, detected_cpu_isa());
  if (detected_cpu_isa() < CpuIsa::kAvx512) {
    std::cout << "NOTE: this CPU has no AVX-512 (detected " << cpu_isa_name(detected_cpu_isa())
              << "); the AVX-512 kernels were not exercised here\n";
  }
}

// TESSERA_CPU_ISA lowers the flavour: resolved into the options (no fork, no setenv), and
// the options into what the kernels run; never raised above what the CPU supports.
TEST(LinearCpu, EnvironmentSelectsScalarFlavour) {
  const StatusOr<KernelOptions> resolved = resolve_kernel_options({}, {{"TESSERA_CPU_ISA", "scalar"}});
  ASSERT_TRUE(resolved.is_ok()) << resolved.status().to_string();
  EXPECT_EQ(linear_options(resolved.value().cpu).isa, CpuIsa::kScalar);
  EXPECT_EQ(usable_cpu_isa(CpuIsa::kScalar), CpuIsa::kScalar);
  EXPECT_EQ(usable_cpu_isa(std::nullopt), detected_cpu_isa());
  EXPECT_EQ(usable_cpu_isa(CpuIsa::kAvx512), detected_cpu_isa());
  EXPECT_EQ(usable_cpu_isa(CpuIsa::kAvx2), std::min(CpuIsa::kAvx2, detected_cpu_isa()));
}

// Each switch of CpuKernelOptions reaches LinearOptions.
TEST(LinearCpu, OptionsCarryEverySwitch) {
  CpuKernelOptions options;
  options.bf16_dot = false;
  options.gemm = GemmKernel::kOpenBlas;
  const LinearOptions linear = linear_options(options);
  EXPECT_FALSE(linear.bf16_dot);
  EXPECT_EQ(linear.gemm_policy, GemmKernel::kOpenBlas);
  EXPECT_EQ(linear.gemm, GemmKernel::kAuto);  // the forcing knob stays the tests'
  EXPECT_TRUE(linear_options(CpuKernelOptions{}).bf16_dot);
  EXPECT_FALSE(packed_gemm_preferred(detected_cpu_isa(), DType::kF32, 64, GemmKernel::kOpenBlas));
  EXPECT_EQ(packed_gemm_preferred(CpuIsa::kScalar, DType::kF32, 64, GemmKernel::kPacked), false);
  EXPECT_EQ(packed_gemm_preferred(detected_cpu_isa(), DType::kF32, 512, GemmKernel::kPacked),
            detected_cpu_isa() != CpuIsa::kScalar);
}

TEST(LinearCpu, EmptyKGivesBias) {
  const float bias[3] = {1.0f, -2.0f, 3.0f};
  float y[2 * 3] = {};
  const float x[2] = {0, 0};
  const float w[1] = {0};
  linear(x, 2, 0, 1, w, DType::kF32, 3, bias, y, 3, Activation::kNone);
  for (int m = 0; m < 2; ++m) {
    for (int n = 0; n < 3; ++n) EXPECT_EQ(y[m * 3 + n], bias[n]);
  }
}

// The public entry point with one thread and with all of them gives the same answer.
TEST(LinearCpu, SingleThreadMatchesAllThreads) {
  std::mt19937 rng(5);
  const int64_t M = 3, K = 257, N = 1000;
  std::vector<float> x(M * K);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  Weights w = make_weights(DType::kBF16, N, K, rng);
  std::vector<float> y_all(M * N), y_one(M * N);
  linear(x.data(), M, K, K, w.data(), DType::kBF16, N, nullptr, y_all.data(), N, Activation::kNone);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  linear(x.data(), M, K, K, w.data(), DType::kBF16, N, nullptr, y_one.data(), N, Activation::kNone);
  omp_set_num_threads(threads);
  // Same kernel, same per-row summation order: identical bits.
  EXPECT_EQ(std::memcmp(y_all.data(), y_one.data(), y_all.size() * sizeof(float)), 0);
}

// Decode batches: a row of x gets the same bits alone as beside other rows, so a sequence's
// tokens do not depend on what else the scheduler runs with it. Holds where one kernel family
// takes every batch size (AVX-512's f32/f16 GEMV up to 4 rows, the bf16 dot GEMV up to 16);
// the single-row kernels stream differently from the tiles but must sum in the same order.
TEST(LinearCpu, ARowAloneGetsTheBitsItGetsInADecodeBatch) {
  if (detected_cpu_isa() != CpuIsa::kAvx512) GTEST_SKIP() << "the AVX-512 GEMV kernels are not usable here";
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t N = 1000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<int64_t> batches = {2, 3, 4};
    if (dtype == DType::kBF16) {
      if (!detail::cpu_has_bf16_dot()) continue;  // without it bf16 batches of 1-2 take their own kernel
      batches.insert(batches.end(), {9, 16});     // 9: a tile of 8, then a lone row
    }
    for (int64_t K : {300, 2048}) {
      Weights w = make_weights(dtype, N, K, rng);
      for (int64_t M : batches) {
        std::vector<float> x(M * K), y(M * N), y_alone(N);
        for (float& v : x) v = dist(rng);
        linear(x.data(), M, K, K, w.data(), dtype, N, nullptr, y.data(), N, Activation::kNone);
        for (int64_t m = 0; m < M; ++m) {
          linear(x.data() + m * K, 1, K, K, w.data(), dtype, N, nullptr, y_alone.data(), N, Activation::kNone);
          EXPECT_EQ(std::memcmp(y_alone.data(), y.data() + m * N, N * sizeof(float)), 0)
              << dtype_name(dtype) << " K=" << K << " row " << m << " of " << M;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
