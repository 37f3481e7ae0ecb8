// Speculative decoding's compute-bound back-off: a proposal's verification row is priced from
// the measured step time by rows (SchedulerConfig::row_costs), so proposals ride along while
// rows are nearly free and stop once every row costs its full share — even proposals that
// would all be accepted, since each then costs what a plain decode of another sequence does.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "coordinator/engine/row_cost_curve.h"
#include "coordinator/engine/scheduler.h"

namespace tessera {
namespace {

// The "model" continues 1, 2, 3, 1, 2, 3, ...: n-gram lookup on such prompts proposes exactly
// what it will say, so every proposal is accepted.
int32_t next_token(int32_t t) { return t % 3 + 1; }

struct RunCounts {
  int decode_steps = 0;  // sequence steps that sampled after the prompt
  int with_proposals = 0;
  int first_step_proposals = 0;  // proposals carried by the first decode step of the batch
};

// `batch` requests decoding together for `tokens` tokens each under the curve; the executor
// accepts proposals that follow the cycle, as a target model would check them.
RunCounts run(const RowCostCurve& curve, int batch, int tokens) {
  SchedulerConfig config;
  config.block_size = 16;
  config.num_blocks = 4096;
  config.max_model_len = 256;
  config.max_num_seqs = batch;
  config.speculative.method = SpeculativeConfig::Method::kNgram;
  config.speculative.num_tokens = 4;
  config.row_costs = curve;
  Scheduler sched(config);
  for (RequestId id = 1; id <= static_cast<RequestId>(batch); ++id) {
    auto r = std::make_shared<Request>();
    r->prompt = {1, 2, 3, 1, 2, 3, 1, 2};
    r->max_tokens = tokens;
    r->stop.ignore_eos = true;
    EXPECT_TRUE(sched.add_request(id, r).is_ok());
  }
  RunCounts counts;
  bool first_decode_step = true;
  while (sched.has_work()) {
    StepPlan plan = sched.schedule();
    StepResult result;
    result.step_id = plan.step_id;
    bool decoded = false;
    for (const SeqStep& s : plan.seqs) {
      if (!s.sample) continue;
      const auto known = static_cast<int>(s.tokens.size()) - s.num_draft;
      int32_t last = s.tokens[static_cast<size_t>(known - 1)];
      if (s.num_computed > 0) {
        decoded = true;
        ++counts.decode_steps;
        if (s.num_draft > 0) ++counts.with_proposals;
        if (first_decode_step) counts.first_step_proposals += s.num_draft;
      }
      for (int i = 0; i < s.num_draft; ++i) {
        const int32_t proposal = s.tokens[static_cast<size_t>(known + i)];
        if (proposal != next_token(last)) break;
        result.tokens.push_back(SampledToken{s.seq_id, proposal, 0.0f, {}});
        last = proposal;
      }
      result.tokens.push_back(SampledToken{s.seq_id, next_token(last), 0.0f, {}});
    }
    if (decoded) first_decode_step = false;
    sched.on_step_result(plan, result);
  }
  return counts;
}

RowCostCurve curve_of(double base_ms, double per_row_ms, int free_rows) {
  RowCostCurve curve;
  for (int rows = 1; rows <= 256; rows *= 2) curve.add(rows, 1e-3 * (base_ms + per_row_ms * std::max(0, rows - free_rows)));
  return curve;
}

TEST(RowCostCurve, InterpolatesTheLowerHullAndFindsWhereRowsStopBeingFree) {
  RowCostCurve curve;
  EXPECT_TRUE(curve.empty());
  EXPECT_EQ(curve.seconds(4), 0.0);
  EXPECT_EQ(curve.marginal_seconds(4), 0.0);
  EXPECT_EQ(curve.nearly_free_rows(), 0);
  curve.add(4, 0.014);
  curve.add(1, 0.010);
  curve.add(16, 0.030);
  curve.add(8, 0.012);
  curve.add(2, 0.0125);  // above the line from 1 to 8 rows: noise, off the hull
  using Points = std::vector<std::pair<int, double>>;
  EXPECT_EQ(curve.points(), (Points{{1, 0.010}, {8, 0.012}, {16, 0.030}}));
  EXPECT_EQ(curve.measured().size(), 5u);
  EXPECT_DOUBLE_EQ(curve.seconds(0.5), 0.010);
  EXPECT_DOUBLE_EQ(curve.seconds(4.5), 0.011);
  EXPECT_DOUBLE_EQ(curve.seconds(12), 0.021);
  EXPECT_DOUBLE_EQ(curve.seconds(32), 0.030 + 16 * 0.018 / 8);  // the last slope, extended
  EXPECT_DOUBLE_EQ(curve.marginal_seconds(2), 0.002 / 7);
  EXPECT_DOUBLE_EQ(curve.marginal_seconds(8), 0.018 / 8);
  EXPECT_DOUBLE_EQ(curve.marginal_seconds(100), 0.018 / 8);
  EXPECT_EQ(curve.nearly_free_rows(), 8);
  EXPECT_EQ(curve.describe(), "1: 10.0 ms, 2: 12.5 ms, 4: 14.0 ms, 8: 12.0 ms, 16: 30.0 ms");
  // A larger step measured faster than the first: no negative slope.
  RowCostCurve dip;
  dip.add(1, 0.012);
  dip.add(2, 0.010);
  dip.add(4, 0.016);
  EXPECT_GE(dip.marginal_seconds(1), 0.0);
  EXPECT_GE(dip.seconds(2), dip.seconds(1));
}

TEST(SpeculationBackoff, ProposalsRideWhileRowsAreNearlyFreeAndStopWhenEachCostsItsShare) {
  // Bound by reading the weights at any size: every decode step carries proposals.
  const RunCounts flat = run(curve_of(10, 0, 256), 16, 40);
  EXPECT_GT(flat.with_proposals, flat.decode_steps * 9 / 10) << flat.with_proposals << " of " << flat.decode_steps;
  // Each row costs its full share from the first: only the probes every few steps (a probe's
  // single proposal is accepted, but a row costing a whole decode never pays).
  for (const int batch : {1, 16}) {
    const RunCounts bound = run(curve_of(0, 1, 0), batch, 40);
    EXPECT_LE(bound.with_proposals, bound.decode_steps / 6)
        << "batch " << batch << ": " << bound.with_proposals << " of " << bound.decode_steps;
  }
  // Free up to 8 rows, then a millisecond a row: one sequence speculates at once, 64 decoding
  // together (already past the knee) start with none.
  const RowCostCurve knee = curve_of(10, 1, 8);
  EXPECT_GT(run(knee, 1, 20).first_step_proposals, 0);
  EXPECT_EQ(run(knee, 64, 20).first_step_proposals, 0);
  // Unmeasured (an empty curve): rows count as free, as before the back-off.
  const RunCounts unmeasured = run(RowCostCurve{}, 16, 40);
  EXPECT_GT(unmeasured.with_proposals, unmeasured.decode_steps * 9 / 10);
}

}  // namespace
}  // namespace tessera
