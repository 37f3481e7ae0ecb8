// The per-sequence speculation depth: the k maximising expected tokens per unit of step cost.
#include "coordinator/engine/speculation_depth.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(SpeculationDepth, FreeProposalsGoDeepCostlyOnesShallowUselessOnesToNone) {
  // Free proposals (n-gram lookup): any acceptance above 0 pays for the deepest k.
  EXPECT_EQ(best_speculation_depth(0.3, 0.0, 4), 4);
  EXPECT_EQ(best_speculation_depth(0.0, 0.0, 4), 0);  // nothing is ever accepted: plain steps
  // A draft costing 2% of a step, accepting 78%: deep (E(4) / 1.08 = 2.98 beats shallower k).
  EXPECT_EQ(best_speculation_depth(0.78, 0.02, 4), 4);
  // The same draft at 56% of a step: E(1) / 1.56 = 1.14 beats E(2) / 2.12 = 1.13 and plain.
  EXPECT_EQ(best_speculation_depth(0.78, 0.56, 4), 1);
  // A draft nobody agrees with (E(1) / 1.05 = 0.97): no depth pays.
  EXPECT_EQ(best_speculation_depth(0.02, 0.05, 4), 0);
  EXPECT_EQ(best_speculation_depth(1.0, 0.1, 16), 16);
}

TEST(SpeculationDepth, AcceptanceFollowsRecentStepsAndCountsOnlyTheTriedProposals) {
  AcceptanceEstimate a;
  EXPECT_NEAR(a.rate(), 0.7, 1e-12);  // the prior
  for (int i = 0; i < 30; ++i) a.record(4, 4);
  EXPECT_GT(a.rate(), 0.99);
  // Every step rejecting its first proposal: one failed trial each (the rest were never tried).
  for (int i = 0; i < 30; ++i) a.record(4, 0);
  EXPECT_LT(a.rate(), 0.01);
  AcceptanceEstimate b;
  for (int i = 0; i < 60; ++i) b.record(4, 2);  // 2 successes, then the failure: 2 / 3
  EXPECT_NEAR(b.rate(), 2.0 / 3.0, 1e-3);
  b.record(0, 0);  // nothing checked: no evidence
  EXPECT_NEAR(b.rate(), 2.0 / 3.0, 1e-3);
}

}  // namespace
}  // namespace tessera
