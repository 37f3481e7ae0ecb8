// Backend::lora_add on the CPU against a plain double-precision transcription of
// out += scale · B (A x), per segment: segments of ranks 8, 16 and 64 (one adapter's split in
// three segments) over a batch with rows that belong to none (left bit for bit), out as a column slice of a wider buffer (the columns
// beside it untouched), the same result whatever the order the segments come in, and
// overlapping segments refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.h"

namespace tessera {
namespace {

Tensor random_f32(const std::vector<int64_t>& dims, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::zeros(dims, DType::kF32);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// f32 values that bf16 holds exactly when `dtype` is bf16 (so the reference uses what is stored).
Tensor representable(Tensor t, DType dtype) {
  if (dtype == DType::kBF16)
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = bf16_to_f32(f32_to_bf16(t.data<float>()[i]));
  return t;
}

Tensor stored_as(const Tensor& f32, DType dtype) {
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::zeros(f32.view().dims(), DType::kBF16);
  convert_elements(f32.data<float>(), DType::kF32, out.data<void>(), DType::kBF16, static_cast<size_t>(f32.numel()));
  return out;
}

struct Adapter {
  Tensor a, b;  // f32 values, for the reference
  float scale;
  Tensor a_stored, b_stored;  // as lora_add gets them
};

// Each SIMD flavour the kernels may be limited to (a flavour this CPU lacks runs its best), with
// f32 and bf16 factors.
class LoraAdd : public ::testing::TestWithParam<std::tuple<cpu::CpuIsa, DType>> {};

TEST_P(LoraAdd, EachSegmentGetsItsAdapterAndOtherRowsAreLeftAlone) {
  KernelOptions kernels;
  kernels.cpu.isa = std::get<0>(GetParam());
  const DType factors = std::get<1>(GetParam());
  auto backend = make_backend("cpu", BackendOptions{2, 0, kernels}).value();
  std::mt19937 rng(7);
  constexpr int64_t kRows = 20, kIn = 40, kOut = 30, kWide = 50, kFirstColumn = 10;
  const Tensor x = random_f32({kRows, kIn}, rng);
  // shrink [in, r] and expand [r, out] (LoraSegment).
  std::vector<Adapter> adapters;
  for (const auto& [rank, scale] : {std::pair{8, 2.0f}, std::pair{16, 0.5f}, std::pair{64, 0.125f}}) {
    Adapter& ad = adapters.emplace_back();
    ad.a = representable(random_f32({kIn, rank}, rng), factors);
    ad.b = representable(random_f32({rank, kOut}, rng), factors);
    ad.scale = scale;
    ad.a_stored = stored_as(ad.a, factors);
    ad.b_stored = stored_as(ad.b, factors);
  }
  struct Span {
    int64_t begin, end;
    int adapter;
  };
  // Rows 3, 4, 6, 11 and 14: the base alone. Adapter 0 has three segments apart (9 rows: the
  // CPU computes an adapter's rows four at a time, across segments).
  const std::vector<Span> spans = {{0, 3, 0}, {5, 6, 1}, {7, 11, 2}, {12, 14, 0}, {15, 20, 0}};
  const Tensor before = random_f32({kRows, kWide}, rng);
  auto run = [&](bool reversed) {
    Tensor wide = Tensor::zeros({kRows, kWide}, DType::kF32);
    std::copy(before.data<float>(), before.data<float>() + before.numel(), wide.data<float>());
    std::vector<LoraSegment> segments;
    for (const Span& s : spans) {
      const Adapter& ad = adapters[static_cast<size_t>(s.adapter)];
      segments.push_back({s.begin, s.end, ad.a_stored.view(), ad.b_stored.view(), ad.scale});
    }
    if (reversed) std::reverse(segments.begin(), segments.end());
    backend->lora_add(x.view(), segments, wide.view().columns(kFirstColumn, kOut));
    return wide;
  };
  const Tensor got = run(false);
  for (int64_t r = 0; r < kRows; ++r) {
    const Span* span = nullptr;
    for (const Span& s : spans)
      if (r >= s.begin && r < s.end) span = &s;
    for (int64_t c = 0; c < kWide; ++c) {
      const float was = before.data<float>()[r * kWide + c], now = got.data<float>()[r * kWide + c];
      const bool adapted = span != nullptr && c >= kFirstColumn && c < kFirstColumn + kOut;
      if (!adapted) {
        ASSERT_EQ(now, was) << "row " << r << " column " << c << " is not the adapter's to change";
        continue;
      }
      const Adapter& ad = adapters[static_cast<size_t>(span->adapter)];
      const int64_t rank = ad.a.dim(1), j = c - kFirstColumn;
      double delta = 0, magnitude = 0;
      for (int64_t k = 0; k < rank; ++k) {
        double t = 0, t_mag = 0;
        for (int64_t i = 0; i < kIn; ++i) {
          t += static_cast<double>(ad.a.data<float>()[i * rank + k]) * x.data<float>()[r * kIn + i];
          t_mag += std::fabs(static_cast<double>(ad.a.data<float>()[i * rank + k]) * x.data<float>()[r * kIn + i]);
        }
        delta += ad.b.data<float>()[k * kOut + j] * t;
        magnitude += std::fabs(ad.b.data<float>()[k * kOut + j]) * t_mag;
      }
      const double want = was + ad.scale * delta;
      // f32 sums of at most 64 and 40 terms: well within 1e-5 of the terms' magnitudes.
      EXPECT_NEAR(now, want, 1e-5 * (ad.scale * magnitude + std::fabs(was)) + 1e-7) << "row " << r << " column " << c;
    }
  }
  const Tensor reversed = run(true);
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_EQ(reversed.data<float>()[i], got.data<float>()[i]) << "element " << i << " depends on the segments' order";
}

INSTANTIATE_TEST_SUITE_P(Isa, LoraAdd,
                         ::testing::Combine(::testing::Values(cpu::CpuIsa::kScalar, cpu::CpuIsa::kAvx2,
                                                              cpu::CpuIsa::kAvx512),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<cpu::CpuIsa, DType>>& i) {
                           return std::string(cpu_isa_name(std::get<0>(i.param))) + "_" +
                                  dtype_name(std::get<1>(i.param));
                         });

// A packed projection's parts (q_proj's and k_proj's columns, a gap between) in one call give
// what a call per part on its column slice gives, bit for bit, and nothing outside them moves.
TEST(LoraAdd, PartsAtTheirOwnColumnsAreOneCall) {
  auto backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}}).value();
  std::mt19937 rng(11);
  const Tensor x = random_f32({6, 24}, rng);
  const Tensor q_shrink = random_f32({24, 8}, rng), q_expand = random_f32({8, 10}, rng);
  const Tensor k_shrink = random_f32({24, 4}, rng), k_expand = random_f32({4, 6}, rng);
  const Tensor before = random_f32({6, 20}, rng);
  auto fresh = [&] {
    Tensor t = Tensor::zeros({6, 20}, DType::kF32);
    std::copy(before.data<float>(), before.data<float>() + before.numel(), t.data<float>());
    return t;
  };
  Tensor one_call = fresh();
  backend->lora_add(x.view(),
                    {{0, 4, q_shrink.view(), q_expand.view(), 0.5f, 0}, {2, 6, k_shrink.view(), k_expand.view(), 2.0f, 12}},
                    one_call.view());
  Tensor per_part = fresh();
  backend->lora_add(x.view(), {{0, 4, q_shrink.view(), q_expand.view(), 0.5f}}, per_part.view().columns(0, 10));
  backend->lora_add(x.view(), {{2, 6, k_shrink.view(), k_expand.view(), 2.0f}}, per_part.view().columns(12, 6));
  int changed = 0;
  for (int64_t i = 0; i < one_call.numel(); ++i) {
    ASSERT_EQ(one_call.data<float>()[i], per_part.data<float>()[i]) << "element " << i;
    changed += one_call.data<float>()[i] != before.data<float>()[i];
  }
  EXPECT_EQ(changed, 4 * 10 + 4 * 6);  // q's rows 0-3 and k's rows 2-5, columns 10, 11, 18, 19 untouched
}

TEST(LoraAddDeathTest, OverlappingSegmentsAreRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto backend = make_backend("cpu").value();
  std::mt19937 rng(1);
  const Tensor x = random_f32({4, 8}, rng), a = random_f32({8, 2}, rng), b = random_f32({2, 6}, rng);
  Tensor out = Tensor::zeros({4, 6}, DType::kF32);
  const std::vector<LoraSegment> overlapping = {{0, 3, a.view(), b.view(), 1.0f}, {2, 4, a.view(), b.view(), 1.0f}};
  EXPECT_DEATH(backend->lora_add(x.view(), overlapping, out.view()), "lora_add: segments overlap");
  const std::vector<LoraSegment> past_the_end = {{3, 5, a.view(), b.view(), 1.0f}};
  EXPECT_DEATH(backend->lora_add(x.view(), past_the_end, out.view()), "outside the 4 rows");
  const Tensor narrow = random_f32({2, 4}, rng);  // columns [0, 4) and [2, 6) overlap
  const std::vector<LoraSegment> columns = {{0, 1, a.view(), narrow.view(), 1.0f, 0}, {2, 3, a.view(), narrow.view(), 1.0f, 2}};
  EXPECT_DEATH(backend->lora_add(x.view(), columns, out.view()), "column ranges");
  const std::vector<LoraSegment> too_far = {{0, 1, a.view(), narrow.view(), 1.0f, 3}};
  EXPECT_DEATH(backend->lora_add(x.view(), too_far, out.view()), "at column 3");
}

}  // namespace
}  // namespace tessera
