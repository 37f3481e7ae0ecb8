// Backend::lora_add on the CPU against a plain double-precision transcription of
// out += scale · B (A x), per segment: segments of ranks 8, 16 and 64 over a batch with rows
// that belong to none (left bit for bit), out as a column slice of a wider buffer (the columns
// beside it untouched), the same result whatever the order the segments come in, and
// overlapping segments refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
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

struct Adapter {
  Tensor a, b;
  float scale;
};

TEST(LoraAdd, EachSegmentGetsItsAdapterAndOtherRowsAreLeftAlone) {
  auto backend = make_backend("cpu", BackendOptions{2, 0, KernelOptions{}}).value();
  std::mt19937 rng(7);
  constexpr int64_t kRows = 11, kIn = 40, kOut = 30, kWide = 50, kFirstColumn = 10;
  const Tensor x = random_f32({kRows, kIn}, rng);
  const std::vector<Adapter> adapters = {{random_f32({8, kIn}, rng), random_f32({kOut, 8}, rng), 2.0f},
                                         {random_f32({16, kIn}, rng), random_f32({kOut, 16}, rng), 0.5f},
                                         {random_f32({64, kIn}, rng), random_f32({kOut, 64}, rng), 0.125f}};
  struct Span {
    int64_t begin, end;
    int adapter;
  };
  const std::vector<Span> spans = {{0, 3, 0}, {5, 6, 1}, {7, 11, 2}};  // rows 3, 4 and 6: the base alone
  const Tensor before = random_f32({kRows, kWide}, rng);
  auto run = [&](bool reversed) {
    Tensor wide = Tensor::zeros({kRows, kWide}, DType::kF32);
    std::copy(before.data<float>(), before.data<float>() + before.numel(), wide.data<float>());
    std::vector<LoraSegment> segments;
    for (const Span& s : spans) {
      const Adapter& ad = adapters[static_cast<size_t>(s.adapter)];
      segments.push_back({s.begin, s.end, ad.a.view(), ad.b.view(), ad.scale});
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
      const int64_t rank = ad.a.dim(0), j = c - kFirstColumn;
      double delta = 0, magnitude = 0;
      for (int64_t k = 0; k < rank; ++k) {
        double t = 0, t_mag = 0;
        for (int64_t i = 0; i < kIn; ++i) {
          t += static_cast<double>(ad.a.data<float>()[k * kIn + i]) * x.data<float>()[r * kIn + i];
          t_mag += std::fabs(static_cast<double>(ad.a.data<float>()[k * kIn + i]) * x.data<float>()[r * kIn + i]);
        }
        delta += ad.b.data<float>()[j * rank + k] * t;
        magnitude += std::fabs(ad.b.data<float>()[j * rank + k]) * t_mag;
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

TEST(LoraAddDeathTest, OverlappingSegmentsAreRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto backend = make_backend("cpu").value();
  std::mt19937 rng(1);
  const Tensor x = random_f32({4, 8}, rng), a = random_f32({2, 8}, rng), b = random_f32({6, 2}, rng);
  Tensor out = Tensor::zeros({4, 6}, DType::kF32);
  const std::vector<LoraSegment> overlapping = {{0, 3, a.view(), b.view(), 1.0f}, {2, 4, a.view(), b.view(), 1.0f}};
  EXPECT_DEATH(backend->lora_add(x.view(), overlapping, out.view()), "lora_add: segments overlap");
  const std::vector<LoraSegment> past_the_end = {{3, 5, a.view(), b.view(), 1.0f}};
  EXPECT_DEATH(backend->lora_add(x.view(), past_the_end, out.view()), "outside the 4 rows");
}

}  // namespace
}  // namespace tessera
