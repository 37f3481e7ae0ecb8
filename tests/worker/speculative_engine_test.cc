// Speculative decoding must not change a token: the fixture prompts run through Engine +
// Scheduler + Executor with n-gram proposals (coordinator/engine/proposer.h) verified in the
// same step, and each must give the reference's greedy ids — arriving at different steps, with
// 8-token prefill chunks, in a pool small enough to force preemption, with the prefix cache —
// and the same ids and logprobs as the run without proposals, also with penalties and with
// seeded sampling (the executor samples each proposal's row with the counter decoding one by
// one would use, so a proposal is kept exactly when that draw gives it).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "coordinator/engine/engine.h"
#include "kernels/backend.h"
#include "tests/test_support.h"
#include "tests/worker/golden_model_fixture.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

using Case = testing::GoldenIds;

struct EngineRun {
  std::vector<std::vector<SampledToken>> outputs;  // per case
  SchedulerStats stats;
};

// Adds case i at step i * `stagger` (max_tokens: its golden length), runs to completion.
// `draft`: the executor's draft model (speculative.method draft).
EngineRun run_engine(Transformer& model, Backend& backend, const std::vector<Case>& cases, const SchedulerConfig& sc,
                     int stagger, const SamplingParams& sampling, bool speculative = true, Transformer* draft = nullptr) {
  Executor executor(model, backend, sc.block_size, sc.num_blocks, model.dtype(), draft);
  Engine engine(sc, executor);
  EngineRun run;
  run.outputs.resize(cases.size());
  std::map<SeqId, size_t> index_of;
  size_t next = 0;
  for (uint64_t step = 0; next < cases.size() || engine.has_work(); ++step) {
    while (next < cases.size() && step >= next * static_cast<uint64_t>(stagger)) {
      StopConditions stop;
      stop.ignore_eos = true;
      const RequestId id = next + 1;
      auto request = std::make_shared<Request>(
          *make_request(cases[next].prompt, static_cast<int>(cases[next].greedy.size()), sampling, stop));
      request->speculative = speculative;  // the request's own opt-out
      const Status st = engine.add_request(id, std::move(request));
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      if (!st.is_ok()) return run;
      index_of[id] = next++;
    }
    for (const SequenceEvent& ev : engine.step()) {
      EXPECT_NE(ev.reason, FinishReason::kError) << ev.error;
      auto& out = run.outputs[index_of[ev.seq_id]];
      out.insert(out.end(), ev.new_tokens.begin(), ev.new_tokens.end());
    }
    engine.scheduler().check_invariants();
    EXPECT_LT(step, 100000u) << "engine did not finish";
    if (step >= 100000u) break;
  }
  run.stats = engine.scheduler().stats();
  return run;
}

std::vector<int32_t> ids(const std::vector<SampledToken>& tokens) {
  std::vector<int32_t> out;
  for (const SampledToken& t : tokens) out.push_back(t.token);
  return out;
}

SchedulerConfig with_ngram(SchedulerConfig sc, int k) {
  sc.speculative.method = SpeculativeConfig::Method::kNgram;
  sc.speculative.num_tokens = k;
  sc.speculative.ngram_min = 1;
  sc.speculative.ngram_max = 3;
  return sc;
}

SchedulerConfig with_draft(SchedulerConfig sc, int k) {
  sc.speculative.method = SpeculativeConfig::Method::kDraft;
  sc.speculative.num_tokens = k;
  sc.speculative.draft_model = "(in process)";
  return sc;
}

class SpeculativeEngineTest : public testing::GoldenModelTest {
 protected:
  SchedulerConfig base(int num_blocks) const {
    SchedulerConfig sc;
    sc.block_size = 4;
    sc.num_blocks = num_blocks;
    sc.max_num_batched_tokens = 8;  // prompts longer than 8 are prefilled in chunks
    sc.max_model_len = 4096;
    sc.sliding_window = model_->config().kv_window();
    return sc;
  }
  // Room for every case at once, proposals included.
  int blocks_for_all() const { return GoldenModelTest::blocks_for_all(4, 8); }
};

// Every golden model, greedy: alone, staggered with 8-token chunks, and in a pool that forces
// preemption by recompute; ids equal to the goldens, logprobs equal to the plain run's.
TEST_P(SpeculativeEngineTest, NgramProposalsGiveTheGreedyIdsAndLogprobsOfPlainDecoding) {
  SamplingParams greedy;
  greedy.logprobs = 2;
  const SchedulerConfig roomy = base(blocks_for_all());
  const EngineRun plain = run_engine(*model_, *backend_, cases_, roomy, /*stagger=*/3, greedy);
  const EngineRun spec = run_engine(*model_, *backend_, cases_, with_ngram(roomy, 4), /*stagger=*/3, greedy);
  for (size_t i = 0; i < cases_.size(); ++i) {
    EXPECT_EQ(ids(spec.outputs[i]), cases_[i].greedy) << "case " << i;
    ASSERT_EQ(spec.outputs[i].size(), plain.outputs[i].size()) << "case " << i;
    for (size_t t = 0; t < plain.outputs[i].size(); ++t) {
      // The verifying step scores several rows at once: the same math, possibly another kernel.
      EXPECT_NEAR(spec.outputs[i][t].logprob, plain.outputs[i][t].logprob, 1e-3) << "case " << i << " token " << t;
      ASSERT_EQ(spec.outputs[i][t].top_logprobs.size(), 2u);
    }
  }
  int longest = 0;
  for (const Case& c : cases_)
    longest = std::max<int>(longest, static_cast<int>((c.prompt.size() + c.greedy.size() + 3) / 4));
  SchedulerConfig tight = with_ngram(base(longest + 4), 4);
  tight.max_num_batched_tokens = 16;
  const EngineRun pressed = run_engine(*model_, *backend_, cases_, tight, /*stagger=*/0, SamplingParams{});
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(ids(pressed.outputs[i]), cases_[i].greedy) << "case " << i << " tight pool";
  // (With a sliding window on every layer the blocks the window left are freed, and the pool
  // may suffice.)
  if (model_->config().kv_window() == 0) {
    EXPECT_GT(pressed.stats.num_preemptions, 0u) << "the pool was meant to force preemption";
  }

  EXPECT_GT(spec.stats.spec.num_drafts, 0u) << "no step carried proposals";
  EXPECT_LE(spec.stats.spec.num_accepted_tokens, spec.stats.spec.num_draft_tokens);
  std::cout << "[ REPORT   ] " << GetParam() << ": " << spec.stats.spec.num_accepted_tokens << " of "
            << spec.stats.spec.num_draft_tokens << " proposals accepted in " << spec.stats.spec.num_drafts
            << " speculating steps; " << spec.stats.num_steps << " steps against " << plain.stats.num_steps
            << " without; tight pool: " << pressed.stats.num_preemptions << " preemptions" << std::endl;
}

// Penalties read the tokens before each row (not the proposals after it), and seeded sampling
// draws with the counter of the token decoded one by one: both give the plain run's tokens.
TEST_P(SpeculativeEngineTest, PenaltiesAndSeededSamplingGiveThePlainRunsTokens) {
  const SchedulerConfig sc = base(blocks_for_all());
  SamplingParams penalised;
  penalised.repetition_penalty = 1.3f;
  penalised.frequency_penalty = 0.4f;
  penalised.presence_penalty = 0.2f;
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.top_p = 0.95f;
  seeded.seed = 77;
  for (const SamplingParams& sampling : {penalised, seeded}) {
    const EngineRun plain = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/2, sampling);
    const EngineRun spec = run_engine(*model_, *backend_, cases_, with_ngram(sc, 3), /*stagger=*/2, sampling);
    for (size_t i = 0; i < cases_.size(); ++i)
      EXPECT_EQ(ids(spec.outputs[i]), ids(plain.outputs[i])) << "case " << i << (sampling.seed ? " seeded" : " penalised");
  }
}

// The model as its own draft (worker/draft_model.h): the draft sees every committed token,
// proposes after each step, and the target checks; greedy ids equal the goldens and logprobs
// the plain run's — staggered with 8-token chunks, one at a time, and in a pool that forces
// preemption —
// and nearly every proposal is accepted (the draft computes what the target does).
TEST_P(SpeculativeEngineTest, SelfDraftGivesTheGreedyIdsAndLogprobsOfPlainDecoding) {
  auto loaded = Transformer::load(testing::fixtures_dir() + "/" + GetParam(), ModelLoadOptions{}, *backend_);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  Transformer& draft = **loaded;
  SamplingParams greedy;
  greedy.logprobs = 2;
  const SchedulerConfig roomy = base(blocks_for_all());
  const EngineRun plain = run_engine(*model_, *backend_, cases_, roomy, /*stagger=*/3, greedy);
  const EngineRun spec = run_engine(*model_, *backend_, cases_, with_draft(roomy, 4), /*stagger=*/3, greedy, true, &draft);
  for (size_t i = 0; i < cases_.size(); ++i) {
    EXPECT_EQ(ids(spec.outputs[i]), cases_[i].greedy) << "case " << i;
    ASSERT_EQ(spec.outputs[i].size(), plain.outputs[i].size()) << "case " << i;
    for (size_t t = 0; t < plain.outputs[i].size(); ++t)
      EXPECT_NEAR(spec.outputs[i][t].logprob, plain.outputs[i][t].logprob, 1e-3) << "case " << i << " token " << t;
  }
  // One at a time: each case alone in the engine (the next arrives long after it finished).
  const EngineRun alone = run_engine(*model_, *backend_, cases_, with_draft(roomy, 4), /*stagger=*/500, greedy, true, &draft);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(ids(alone.outputs[i]), cases_[i].greedy) << "case " << i << " alone";
  EXPECT_GT(spec.stats.spec.num_drafts, 0u) << "no step carried proposals";
  EXPECT_GE(spec.stats.spec.num_accepted_tokens * 10, spec.stats.spec.num_draft_tokens * 9)
      << spec.stats.spec.num_accepted_tokens << " of " << spec.stats.spec.num_draft_tokens << " accepted";
  int longest = 0;
  for (const Case& c : cases_)
    longest = std::max<int>(longest, static_cast<int>((c.prompt.size() + c.greedy.size() + 3) / 4));
  SchedulerConfig tight = with_draft(base(longest + 4), 4);
  tight.max_num_batched_tokens = 16;
  const EngineRun pressed = run_engine(*model_, *backend_, cases_, tight, /*stagger=*/0, SamplingParams{}, true, &draft);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(ids(pressed.outputs[i]), cases_[i].greedy) << "case " << i << " tight pool";
  if (model_->config().kv_window() == 0) {
    EXPECT_GT(pressed.stats.num_preemptions, 0u) << "the pool was meant to force preemption";
  }
  std::cout << "[ REPORT   ] " << GetParam() << " self-draft: " << spec.stats.spec.num_accepted_tokens << " of "
            << spec.stats.spec.num_draft_tokens << " proposals accepted; " << spec.stats.num_steps << " steps against "
            << plain.stats.num_steps << " without; tight pool: " << pressed.stats.num_preemptions << " preemptions"
            << std::endl;
}

// Seeded sampling with a draft follows the speculative-sampling rule on counter-based
// streams: the same seed gives the same tokens when run the same way (how many proposals a
// step checks decides which draws are used, so another batch mix may give another, equally
// distributed, sample), and penalised greedy requests still give the plain run's tokens.
TEST_P(SpeculativeEngineTest, SelfDraftSeededRunsRepeatAndPenalisedGreedyMatchesPlain) {
  auto loaded = Transformer::load(testing::fixtures_dir() + "/" + GetParam(), ModelLoadOptions{}, *backend_);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const SchedulerConfig sc = with_draft(base(blocks_for_all()), 3);
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 1234;
  const EngineRun a = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/2, seeded, true, loaded->get());
  const EngineRun b = run_engine(*model_, *backend_, cases_, sc, /*stagger=*/2, seeded, true, loaded->get());
  for (size_t i = 0; i < cases_.size(); ++i) {
    EXPECT_EQ(ids(a.outputs[i]), ids(b.outputs[i])) << "case " << i;
    EXPECT_EQ(a.outputs[i].size(), cases_[i].greedy.size()) << "case " << i;
  }
  EXPECT_GT(a.stats.spec.num_accepted_tokens, 0u);
  SamplingParams penalised;
  penalised.repetition_penalty = 1.3f;
  penalised.frequency_penalty = 0.4f;
  const EngineRun plain = run_engine(*model_, *backend_, cases_, base(blocks_for_all()), 2, penalised);
  const EngineRun spec = run_engine(*model_, *backend_, cases_, sc, 2, penalised, true, loaded->get());
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(ids(spec.outputs[i]), ids(plain.outputs[i])) << "case " << i;
}

// A request that opts out (the API's "speculative": false) carries no proposals.
TEST_P(SpeculativeEngineTest, RequestsThatOptOutCarryNoProposals) {
  const EngineRun run = run_engine(*model_, *backend_, cases_, with_ngram(base(blocks_for_all()), 4), /*stagger=*/0,
                                   SamplingParams{}, /*speculative=*/false);
  for (size_t i = 0; i < cases_.size(); ++i) EXPECT_EQ(ids(run.outputs[i]), cases_[i].greedy) << "case " << i;
  EXPECT_EQ(run.stats.spec.num_drafts, 0u);
}

// The sanitizer pass (CI's second build) looks for memory errors, not for other numbers: the
// proposals, their verification and the sampler are the same code for every model, so it runs
// a dense, a MoE, an ALiBi and a soft-capped family; the release build runs every fixture.
std::vector<std::string> models_for_this_build() {
  std::vector<std::string> models = testing::golden_models();
  if (testing::kSanitizedBuild)
    std::erase_if(models, [](const std::string& m) {
      return m != "tiny-llama" && m != "tiny-mixtral" && m != "tiny-bloom" && m != "tiny-gemma2";
    });
  return models;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeEngineTest, ::testing::ValuesIn(models_for_this_build()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace tessera
