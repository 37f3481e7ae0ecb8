// Backend::rejection_sample_rows on the CPU (speculative sampling's check where p and q are):
// against the rule worked out independently per case, and over a grid of draws fine enough
// that the share of each output token must equal p to the grid's resolution — the property
// the rule exists for — with a draft that agrees, one that disagrees and one that misses
// tokens p has.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace tessera::cpu {
namespace {

constexpr double kTwo53 = 0x1.0p53;

struct Rows {
  Tensor p, q, proposals, uniforms, tokens, accepted;
  Rows(const std::vector<std::vector<float>>& ps, const std::vector<std::vector<float>>& qs)
      : p(Tensor::zeros({static_cast<int64_t>(ps.size()), static_cast<int64_t>(ps[0].size())}, DType::kF32)),
        q(Tensor::zeros({p.dim(0), p.dim(1)}, DType::kF32)),
        proposals(Tensor::zeros({p.dim(0)}, DType::kI32)),
        uniforms(Tensor::zeros({p.dim(0), 2}, DType::kI64)),
        tokens(Tensor::zeros({p.dim(0)}, DType::kI32)),
        accepted(Tensor::zeros({p.dim(0)}, DType::kI32)) {
    for (size_t r = 0; r < ps.size(); ++r)
      for (size_t i = 0; i < ps[r].size(); ++i) {
        p.data<float>()[r * ps[r].size() + i] = ps[r][i];
        q.data<float>()[r * ps[r].size() + i] = qs[r][i];
      }
  }
  void set(int64_t r, int32_t proposal, double u, double v) {
    proposals.data<int32_t>()[r] = proposal;
    uniforms.data<int64_t>()[2 * r] = static_cast<int64_t>(u * kTwo53);
    uniforms.data<int64_t>()[2 * r + 1] = static_cast<int64_t>(v * kTwo53);
  }
  void run(CpuBackend& backend) { backend.rejection_sample_rows(p, q, proposals, uniforms, tokens, accepted); }
  int32_t token(int64_t r) const { return tokens.data<int32_t>()[r]; }
  bool kept(int64_t r) const { return accepted.data<int32_t>()[r] == 1; }
};

TEST(RejectionSampleRows, KeepsByTheRatioAndDrawsTheResidualInIdOrder) {
  CpuBackend backend(1, CpuKernelOptions{});
  // p = (0.1, 0.6, 0.3), q = (0.5, 0.25, 0.25) given as unnormalised weights (x2 and x4).
  const std::vector<float> p = {0.2f, 1.2f, 0.6f}, q = {2.0f, 1.0f, 1.0f};
  Rows rows({p, p, p, p, p}, {q, q, q, q, q});
  rows.set(0, 1, 0.999, 0.0);  // p/q = 2.4: always kept
  rows.set(1, 0, 0.19, 0.0);   // p/q = 0.2: kept below u = 0.2
  rows.set(2, 0, 0.21, 0.0);   // ... rejected above; residual (0, 0.35, 0.05) / 0.4
  rows.set(3, 0, 0.5, 0.874);  // residual draw: 0.874 * 0.4 = 0.3496 < 0.35 -> id 1
  rows.set(4, 0, 0.5, 0.876);  // 0.3504 -> id 2
  rows.run(backend);
  EXPECT_TRUE(rows.kept(0));
  EXPECT_EQ(rows.token(0), 1);
  EXPECT_TRUE(rows.kept(1));
  EXPECT_EQ(rows.token(1), 0);
  EXPECT_FALSE(rows.kept(2));
  EXPECT_EQ(rows.token(2), 1) << "v = 0 takes the first id with residual weight";
  EXPECT_FALSE(rows.kept(3));
  EXPECT_EQ(rows.token(3), 1);
  EXPECT_FALSE(rows.kept(4));
  EXPECT_EQ(rows.token(4), 2);
}

TEST(RejectionSampleRows, NoResidualDrawsFromPAndAProposalOutsideTheVocabularyIsRejected) {
  CpuBackend backend(1, CpuKernelOptions{});
  const std::vector<float> p = {0.0f, 0.5f, 0.5f};  // q = p: a proposal q gives 0 leaves no residual
  Rows rows({p, p}, {p, p});
  rows.set(0, 0, 0.0, 0.75);  // p(0) = q(0) = 0: rejected; drawn from p: 0.75 -> id 2
  rows.set(1, 7, 0.0, 0.25);  // not a token: rejected; from p: id 1
  rows.run(backend);
  EXPECT_FALSE(rows.kept(0));
  EXPECT_EQ(rows.token(0), 2);
  EXPECT_FALSE(rows.kept(1));
  EXPECT_EQ(rows.token(1), 1);
}

// For each proposal x (weighted by q(x)) and a grid of N x N draws (u, v), the share of rows
// giving each token must be p's, to about 1/N: the output of the rule is distributed as p
// whatever q is.
TEST(RejectionSampleRows, OutputIsDistributedAsTheTargetWhateverTheDraft) {
  CpuBackend backend(2, CpuKernelOptions{});
  const std::vector<float> p = {0.05f, 0.4f, 0.0f, 0.25f, 0.3f};
  const std::vector<std::vector<float>> drafts = {
      p,                                  // agrees: every proposal kept
      {0.3f, 0.1f, 0.2f, 0.25f, 0.15f},  // disagrees, and proposes a token p forbids
      {0.0f, 0.0f, 0.0f, 1.0f, 0.0f},    // always the same token
  };
  constexpr int kGrid = 200;
  const int64_t vocab = static_cast<int64_t>(p.size());
  for (size_t d = 0; d < drafts.size(); ++d) {
    const std::vector<float>& q = drafts[d];
    std::vector<double> share(p.size(), 0.0);
    for (int64_t x = 0; x < vocab; ++x) {
      if (q[static_cast<size_t>(x)] == 0.0f) continue;
      Rows rows(std::vector<std::vector<float>>(kGrid * kGrid, p), std::vector<std::vector<float>>(kGrid * kGrid, q));
      for (int i = 0; i < kGrid; ++i)
        for (int j = 0; j < kGrid; ++j) rows.set(i * kGrid + j, static_cast<int32_t>(x), (i + 0.5) / kGrid, (j + 0.5) / kGrid);
      rows.run(backend);
      for (int64_t r = 0; r < kGrid * kGrid; ++r)
        share[static_cast<size_t>(rows.token(r))] += q[static_cast<size_t>(x)] / (kGrid * kGrid);
    }
    for (size_t y = 0; y < p.size(); ++y) EXPECT_NEAR(share[y], p[y], 2.0 / kGrid) << "draft " << d << " token " << y;
    EXPECT_EQ(share[2], 0.0) << "draft " << d << ": a token p forbids never comes out";
  }
}

}  // namespace
}  // namespace tessera::cpu
