// cpu::gated_silu_row (the gated MLP's silu(g) * u) in each flavour against double precision,
// over the range models feed it (tails included, vector tails of every length), and the bits
// of an element independent of the row's length and of where it lies in the row (a decode
// row gets the bits it gets in a prefill or a batch).
#include "kernels/cpu/gated_silu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels/isa_param_test.h"

namespace tessera::cpu {
namespace {

class GatedSiluTest : public IsaParamTest {};

TEST_P(GatedSiluTest, WithinRelative1e6OfDoublePrecision) {
  std::vector<float> g, u;
  for (int i = -1536; i <= 1536; ++i) g.push_back(static_cast<float>(i) / 64.0f);  // -24 .. 24
  for (float x : {-1000.0f, -100.0f, -89.0f, -87.5f, 87.5f, 89.0f, 100.0f, 1e30f, -1e30f, 0.0f, -0.0f}) g.push_back(x);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  for (size_t i = 0; i < g.size(); ++i) u.push_back(unit(rng));
  std::vector<float> out(g.size());
  gated_silu_row(GetParam(), g.data(), u.data(), static_cast<int64_t>(g.size()), out.data());
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = g[i];
    const double want = x / (1.0 + std::exp(-x)) * u[i];
    // Relative 1e-6 (the vector exp is within 2e-7, the division and product round once
    // each), and 1e-30 absolute: below g ~ -88 e^-g overflows (std::exp: inf, a gate of -0;
    // the vector exp clamps at e^88.3, a gate of ~-g 4e-39), where silu is ~-g e^g < 1e-35.
    EXPECT_LE(std::fabs(out[i] - want), 1e-6 * std::fabs(want) + 1e-30) << "silu(" << x << ") * " << u[i];
  }
}

TEST_P(GatedSiluTest, AnElementsBitsDoNotDependOnTheRowsLengthOrItsPlace) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> g(64), u(64);
  for (float& v : g) v = normal(rng);
  for (float& v : u) v = normal(rng);
  std::vector<float> whole(64);
  gated_silu_row(GetParam(), g.data(), u.data(), 64, whole.data());
  for (int64_t start : {0, 1, 5, 13}) {
    for (int64_t n = 1; start + n <= 64; n += 3) {
      std::vector<float> part(static_cast<size_t>(n));
      gated_silu_row(GetParam(), g.data() + start, u.data() + start, n, part.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(part[static_cast<size_t>(i)], whole[static_cast<size_t>(start + i)])
            << "start " << start << " n " << n << " i " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, GatedSiluTest, ::testing::Values(CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace tessera::cpu
