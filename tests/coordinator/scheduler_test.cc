// Scheduler: token budget, chunked prefill, decode-first order, priorities, admission
// errors, preemption by recompute, prefix reuse, stop conditions, static batching, the
// blocks a sliding window gives back.
#include "coordinator/engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "tests/coordinator/kv_checking_executor.h"

namespace tessera {
namespace {

using testing::KvCheckingExecutor;
using testing::ResolvedPlan;
using testing::ResolvedStep;

std::vector<int32_t> prompt_of(int n, int32_t start = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

struct Finished {
  std::vector<int32_t> output;
  FinishReason reason = FinishReason::kNone;
};

// Drives a scheduler and a fake executor together.
class Harness {
 public:
  explicit Harness(SchedulerConfig config)
      : sched(config), exec(config.block_size, config.num_blocks, 50, config.sliding_window) {}

  void add(SeqId id, int prompt_len, int max_new, int priority = 0, StopConditions stop = {},
           SamplingParams sampling = {}) {
    add_prompt(id, prompt_of(prompt_len, static_cast<int32_t>(id * 1000)), max_new, priority, stop, sampling);
  }
  void add_prompt(SeqId id, std::vector<int32_t> prompt, int max_new, int priority = 0, StopConditions stop = {},
                  SamplingParams sampling = {}) {
    exec.add(id, prompt);
    lens_[id] = prompt.size();
    ASSERT_TRUE(sched.add_request(id, make_request(prompt, max_new, sampling, stop, priority)).is_ok());
  }

  // One step; returns the plan it ran, as the executor saw it (deltas applied).
  ResolvedPlan step() {
    StepPlan plan = sched.schedule();
    int tokens = 0;
    for (const SeqStep& s : plan.seqs) tokens += static_cast<int>(s.tokens.size());
    EXPECT_LE(tokens, sched.config().max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(plan.seqs.size()), sched.config().max_num_seqs);
    const StepResult result = exec.execute(plan);
    const std::vector<SequenceEvent> events = sched.on_step_result(plan, result);
    exec.apply(events);
    for (const SequenceEvent& e : events) {
      if (!e.finished) continue;
      const std::vector<int32_t>& all = exec.tokens(e.seq_id);
      Finished& f = finished[e.seq_id];
      f.reason = e.reason;
      f.output.assign(all.end() - (all.size() - prompt_len(e.seq_id)), all.end());
    }
    sched.check_invariants();
    return exec.last_plan();
  }
  void run(int max_steps = 10000, const std::function<void(const ResolvedPlan&)>& on_plan = {}) {
    for (int i = 0; i < max_steps && sched.has_work(); ++i) {
      ResolvedPlan plan = step();
      if (on_plan) on_plan(plan);
    }
    EXPECT_FALSE(sched.has_work()) << "did not finish in " << max_steps << " steps";
  }
  size_t prompt_len(SeqId id) { return lens_.at(id); }

  Scheduler sched;
  KvCheckingExecutor exec;
  std::map<SeqId, Finished> finished;
  std::map<SeqId, size_t> lens_;
};

SchedulerConfig small_config() {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_blocks = 64;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 32;
  c.max_model_len = 256;
  return c;
}

TEST(SchedulerTest, LongPromptIsChunkedUnderTheTokenBudget) {
  Harness h(small_config());
  h.add(1, 100, 3);
  std::vector<size_t> chunks;
  std::vector<bool> samples;
  for (int i = 0; i < 4; ++i) {
    ResolvedPlan plan = h.step();
    ASSERT_EQ(plan.seqs.size(), 1u);
    chunks.push_back(plan.seqs[0].tokens.size());
    samples.push_back(plan.seqs[0].sample);
    EXPECT_EQ(plan.seqs[0].num_computed, 32 * i);
    EXPECT_EQ(plan.seqs[0].block_table.size(), static_cast<size_t>((32 * i + chunks.back() + 3) / 4));
  }
  EXPECT_EQ(chunks, (std::vector<size_t>{32, 32, 32, 4}));
  EXPECT_EQ(samples, (std::vector<bool>{false, false, false, true}));
  const Sequence* s = h.sched.find(1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->state(), SequenceState::kDecode);
  EXPECT_EQ(s->num_output(), 1);
  h.run();
}

// Each prompt-logprob row is a row of logits over the vocabulary: a step computes at most
// kPromptLogprobRowsPerStep of them (the workers' activation plan counts on it), so a request
// asking them has its prompt cut to that many tokens a step, and a second one waits for a step
// with rows left; requests without them take the rest of the token budget as before.
TEST(SchedulerTest, PromptLogprobRowsOfAStepStayWithinTheirCap) {
  SchedulerConfig c;
  c.block_size = 16;
  c.num_blocks = 512;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 1024;
  c.max_model_len = 2048;
  Harness h(c);
  SamplingParams logprobs;
  logprobs.prompt_logprobs = 1;
  const int long_prompt = 2 * kPromptLogprobRowsPerStep + 100;
  h.add(1, long_prompt, 2, 0, {}, logprobs);
  h.add(2, 300, 2);
  h.add(3, 40, 2, 0, {}, logprobs);
  std::vector<size_t> first_chunks;
  int first_step_of_3 = -1;
  for (int step = 0; step < 50 && h.sched.has_work(); ++step) {
    const ResolvedPlan plan = h.step();
    int rows = 0, tokens = 0;
    for (const ResolvedStep& s : plan.seqs) {
      tokens += static_cast<int>(s.tokens.size());
      if (s.sampling.prompt_logprobs < 0) continue;
      const int prompt_len = static_cast<int>(h.prompt_len(s.seq_id));
      rows += std::clamp(prompt_len - 1 - s.num_computed, 0, static_cast<int>(s.tokens.size()));
      if (s.seq_id == 1 && s.num_computed < prompt_len) first_chunks.push_back(s.tokens.size());
      if (s.seq_id == 3 && first_step_of_3 < 0) first_step_of_3 = step;
    }
    EXPECT_LE(rows, kPromptLogprobRowsPerStep) << "step " << step;
    if (step == 0) {
      EXPECT_EQ(tokens, kPromptLogprobRowsPerStep + 300) << "the plain prompt takes the rest";
    }
  }
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(first_chunks, (std::vector<size_t>{kPromptLogprobRowsPerStep, kPromptLogprobRowsPerStep, 100}));
  EXPECT_EQ(first_step_of_3, 2) << "the second prompt-logprob request starts in the first step with rows left";
  EXPECT_EQ(h.finished.size(), 3u);
}

TEST(SchedulerTest, DecodesComeFirstThenPrefillChunksThenNewRequests) {
  Harness h(small_config());
  h.add(1, 5, 10);
  h.add(2, 6, 10);
  h.step();  // both prefilled whole (11 tokens)
  h.add(3, 60, 10);
  ResolvedPlan plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 3u);
  EXPECT_EQ(plan.seqs[0].seq_id, 1u);
  EXPECT_EQ(plan.seqs[0].tokens.size(), 1u);
  EXPECT_EQ(plan.seqs[1].seq_id, 2u);
  EXPECT_EQ(plan.seqs[1].tokens.size(), 1u);
  EXPECT_EQ(plan.seqs[2].seq_id, 3u);
  EXPECT_EQ(plan.seqs[2].tokens.size(), 30u);  // what the budget leaves
  EXPECT_FALSE(plan.seqs[2].sample);
  h.add(4, 3, 10);
  plan = h.step();  // decodes, then 3's next chunk (30 tokens: the rest), then nothing for 4
  ASSERT_EQ(plan.seqs.size(), 3u);
  EXPECT_EQ(plan.seqs[2].seq_id, 3u);
  EXPECT_EQ(plan.seqs[2].tokens.size(), 30u);
  EXPECT_TRUE(plan.seqs[2].sample);
  plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 4u);
  EXPECT_EQ(plan.seqs[3].seq_id, 4u);
  h.run();
  for (SeqId id : {1, 2, 3, 4}) EXPECT_EQ(h.finished[id].reason, FinishReason::kLength);
}

TEST(SchedulerTest, DecodeFieldsFollowTheStepPlanContract) {
  Harness h(small_config());
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.repetition_penalty = 1.2f;
  h.add(1, 6, 4, 0, {}, sp);
  ResolvedPlan plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 1u);
  const ResolvedStep& s = plan.seqs[0];
  EXPECT_TRUE(s.sample);
  EXPECT_EQ(s.num_generated, 0);
  EXPECT_TRUE(s.sampling.seed.has_value()) << "unseeded sampling gets a stable seed";
  EXPECT_EQ(s.penalty_prompt_len, 6);
  EXPECT_EQ(s.penalty_tokens.size(), 6u);
  plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].num_computed, 6);
  EXPECT_EQ(plan.seqs[0].num_generated, 1);
  EXPECT_EQ(plan.seqs[0].penalty_tokens.size(), 7u);
  EXPECT_EQ(plan.seqs[0].tokens, std::vector<int32_t>{h.exec.tokens(1)[6]});  // the first output
  EXPECT_EQ(plan.seqs[0].block_table.size(), 2u);

  Harness g(small_config());
  g.add(2, 6, 4);  // no penalty: no penalty tokens travel
  plan = g.step();
  EXPECT_TRUE(plan.seqs[0].penalty_tokens.empty());
  EXPECT_FALSE(plan.seqs[0].sampling.seed.has_value()) << "greedy needs no seed";
}

TEST(SchedulerTest, PriorityThenArrivalOrder) {
  SchedulerConfig c = small_config();
  c.max_num_seqs = 1;
  Harness h(c);
  h.add(1, 4, 2, /*priority=*/5);
  h.add(2, 4, 2, 0);
  h.add(3, 4, 2, 0);
  h.add(4, 4, 2, -1);
  std::vector<SeqId> order;
  h.run(1000, [&](const ResolvedPlan& plan) {
    for (const ResolvedStep& s : plan.seqs)
      if (s.num_computed == 0) order.push_back(s.seq_id);
  });
  EXPECT_EQ(order, (std::vector<SeqId>{4, 2, 3, 1}));
}

TEST(SchedulerTest, AdmissionErrorsNameTheRequest) {
  SchedulerConfig c = small_config();
  c.num_blocks = 8;  // 32 tokens
  c.max_model_len = 64;
  Scheduler s(c);
  auto expect_invalid = [&](SeqId id, int prompt_len, int max_new, const char* what) {
    Status st = s.add_request(id, make_request(prompt_of(prompt_len), max_new));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(st.message().find("request " + std::to_string(id)), std::string::npos) << st.message();
  };
  expect_invalid(7, 0, 4, "empty prompt");
  expect_invalid(8, 4, 0, "max_new_tokens 0");
  expect_invalid(9, 64, 4, "longer than max_model_len");
  expect_invalid(10, 32, 4, "more blocks than the pool");
  ASSERT_TRUE(s.add_request(11, make_request(prompt_of(31), 4)).is_ok());  // 31 + 1 fills the pool exactly
  expect_invalid(11, 4, 4, "duplicate id");

  c.chunked_prefill = false;
  c.num_blocks = 64;
  Scheduler t(c);
  Status st = t.add_request(12, make_request(prompt_of(40), 4));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_num_batched_tokens"), std::string::npos) << st.message();

  // The one that fits runs to completion, capped by the pool (32 tokens).
  Harness h(small_config());
  SchedulerConfig tiny = small_config();
  tiny.num_blocks = 8;
  Harness g(tiny);
  g.add(1, 31, 100);
  g.run();
  EXPECT_EQ(g.finished[1].reason, FinishReason::kLength);
  EXPECT_EQ(g.sched.max_sequence_len(), 32);
}

TEST(SchedulerTest, PreemptionUnderATinyPoolStillFinishesEverySequenceIdentically) {
  SchedulerConfig c = small_config();
  c.num_blocks = 10;  // 40 token slots for 4 sequences that grow to 26 tokens each
  Harness h(c);
  for (SeqId id = 1; id <= 4; ++id) h.add(id, 6, 20);
  h.run();
  EXPECT_GT(h.sched.stats().num_preemptions, 0u);
  for (SeqId id = 1; id <= 4; ++id) {
    ASSERT_EQ(h.finished[id].reason, FinishReason::kLength);
    const std::vector<int32_t>& all = h.exec.tokens(id);
    ASSERT_EQ(all.size(), 26u);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(all[6 + i], h.exec.token_for(id, i)) << "seq " << id << " token " << i;
  }
  EXPECT_EQ(h.sched.stats().num_free_blocks, 10);
}

TEST(SchedulerTest, PrefixCacheSkipsASharedPromptPrefix) {
  SchedulerConfig c = small_config();
  c.block_size = 16;
  c.max_num_batched_tokens = 128;
  Harness h(c);
  std::vector<int32_t> shared = prompt_of(64, 500);
  std::vector<int32_t> a = shared, b = shared;
  a.insert(a.end(), {1, 2, 3});
  b.insert(b.end(), {4, 5});
  h.add_prompt(1, a, 5);
  h.step();
  const int free_after_a = h.sched.stats().num_free_blocks;
  h.add_prompt(2, b, 5);
  ResolvedPlan plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[1].num_computed, 64);
  EXPECT_EQ(plan.seqs[1].tokens.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(plan.seqs[1].block_table.begin(), plan.seqs[1].block_table.begin() + 4),
            std::vector<int32_t>(plan.seqs[0].block_table.begin(), plan.seqs[0].block_table.begin() + 4));
  EXPECT_EQ(h.sched.stats().num_free_blocks, free_after_a - 1);
  EXPECT_EQ(h.sched.stats().prefix_hit_tokens, 64u);
  EXPECT_EQ(h.sched.stats().prefix_hit_blocks, 4u);
  h.run();

  // Finished sequences leave their full blocks cached: a later request reuses them.
  h.add_prompt(3, a, 2);
  plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].num_computed, 64);
  EXPECT_EQ(h.sched.stats().prefix_hit_tokens, 128u);
  h.run();
  // The whole prompt cached: its last token is recomputed (for logits). The first sharer owns
  // the cached block alone and rewrites it in place; the second writes into a copy.
  h.add_prompt(4, shared, 3);
  h.add_prompt(5, shared, 3);
  plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 2u);
  EXPECT_EQ(plan.seqs[0].num_computed, 63);
  EXPECT_EQ(plan.seqs[1].num_computed, 63);
  ASSERT_EQ(plan.block_copies.size(), 1u);
  EXPECT_EQ(plan.block_copies[0].first, plan.seqs[0].block_table[3]);
  EXPECT_EQ(plan.block_copies[0].second, plan.seqs[1].block_table[3]);
  h.run();
  EXPECT_EQ(h.sched.stats().num_free_blocks, c.num_blocks);
}

TEST(SchedulerTest, StopConditions) {
  Harness h(small_config());
  const int32_t first1 = h.exec.token_for(1, 0);
  const int32_t third2 = h.exec.token_for(2, 2);
  StopConditions eos;
  eos.eos_token_id = first1;
  h.add(1, 4, 10, 0, eos);
  StopConditions ignore = eos;
  ignore.ignore_eos = true;
  ignore.eos_token_id = h.exec.token_for(3, 0);
  h.add(3, 4, 5, 0, ignore);
  StopConditions stops;
  stops.stop_token_ids = {-7, third2};
  h.add(2, 4, 10, 0, stops);
  h.run();
  EXPECT_EQ(h.finished[1].reason, FinishReason::kStop);
  EXPECT_EQ(h.exec.tokens(1).size(), 5u);  // the eos token is kept
  EXPECT_EQ(h.finished[2].reason, FinishReason::kStop);
  EXPECT_LE(h.exec.tokens(2).size(), 7u);
  EXPECT_EQ(h.finished[3].reason, FinishReason::kLength);
  EXPECT_EQ(h.exec.tokens(3).size(), 9u);
}

TEST(SchedulerTest, AbortFreesWaitingAndRunningSequences) {
  SchedulerConfig c = small_config();
  c.max_num_seqs = 1;
  Harness h(c);
  h.add(1, 10, 50);
  h.add(2, 10, 50);
  h.step();
  EXPECT_LT(h.sched.stats().num_free_blocks, c.num_blocks);
  EXPECT_TRUE(h.sched.abort(2));   // waiting
  EXPECT_FALSE(h.sched.abort(2));  // gone
  // Aborted between schedule() and on_step_result(): its result is dropped.
  StepPlan plan = h.sched.schedule();
  EXPECT_TRUE(h.sched.abort(1));
  const StepResult result = h.exec.execute(plan);
  EXPECT_TRUE(h.sched.on_step_result(plan, result).empty());
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.sched.stats().num_free_blocks, c.num_blocks);
  h.sched.check_invariants();
}

// LoRA adapters changed while serving: a load rides on the next plan (even one with no
// sequence), an unload only once no running or waiting sequence names the adapter, and the
// run-time loads are sent again when the executors lose their state.
TEST(SchedulerTest, LoraLoadsRideOnTheNextPlanAndUnloadsWaitForTheirSequences) {
  Scheduler s(small_config());
  s.add_lora_load("psalms", "/adapters/psalms");
  EXPECT_TRUE(s.has_lora_changes());
  StepPlan plan = s.schedule();
  EXPECT_TRUE(plan.seqs.empty());
  ASSERT_EQ(plan.lora_loads.size(), 1u);
  EXPECT_EQ(plan.lora_loads[0], std::make_pair(std::string("psalms"), std::string("/adapters/psalms")));
  EXPECT_FALSE(s.has_lora_changes());

  auto request = std::make_shared<Request>(*make_request(prompt_of(6), 4));
  request->lora = "psalms";
  ASSERT_TRUE(s.add_request(1, request).is_ok());
  s.add_lora_unload("psalms");
  EXPECT_TRUE(s.uses_lora("psalms"));
  plan = s.schedule();  // the sequence runs: the unload waits
  EXPECT_TRUE(plan.lora_unloads.empty());
  ASSERT_EQ(plan.seqs.size(), 1u);
  ASSERT_TRUE(plan.seqs[0].start.has_value());
  EXPECT_EQ(plan.seqs[0].start->lora, "psalms");
  EXPECT_TRUE(s.abort(1));
  plan = s.schedule();
  ASSERT_EQ(plan.lora_unloads.size(), 1u);
  EXPECT_EQ(plan.lora_unloads[0], "psalms");

  s.add_lora_load("job", "/adapters/job");
  (void)s.schedule();
  s.on_kv_cache_lost();  // restarted executors: the run-time adapters go again (not psalms)
  plan = s.schedule();
  ASSERT_EQ(plan.lora_loads.size(), 1u);
  EXPECT_EQ(plan.lora_loads[0].first, "job");
}

TEST(SchedulerTest, MaxLorasBoundsTheRunningAdaptersWithoutStarvingALaterOne) {
  SchedulerConfig c = small_config();
  c.max_loras = 1;
  Harness h(c);
  // psalms runs first; job waits for it; base requests never wait for an adapter; the psalms
  // request that arrives after job waits behind job instead of keeping psalms resident.
  const std::vector<std::pair<SeqId, std::string>> arrivals = {{1, "psalms"}, {2, "job"}, {3, ""}, {4, "psalms"}, {5, ""}};
  std::map<SeqId, std::string> adapter_of;
  for (const auto& [id, lora] : arrivals) {
    const std::vector<int32_t> prompt = prompt_of(6, static_cast<int32_t>(id * 7));
    h.exec.add(id, prompt);
    h.lens_[id] = prompt.size();
    auto request = std::make_shared<Request>(*make_request(prompt, 5));
    request->lora = lora;
    ASSERT_TRUE(h.sched.add_request(id, request).is_ok());
    adapter_of[id] = lora;
  }
  std::map<SeqId, int> first_step, last_step;
  int step = 0;
  h.run(1000, [&](const ResolvedPlan& plan) {
    std::set<std::string> adapters;
    for (const ResolvedStep& s : plan.seqs) {
      if (!adapter_of.at(s.seq_id).empty()) adapters.insert(adapter_of.at(s.seq_id));
      if (first_step.count(s.seq_id) == 0) first_step[s.seq_id] = step;
      last_step[s.seq_id] = step;
    }
    EXPECT_LE(adapters.size(), 1u) << "step " << step;
    ++step;
  });
  ASSERT_EQ(h.finished.size(), arrivals.size());
  EXPECT_EQ(first_step.at(1), 0);
  EXPECT_EQ(first_step.at(3), 0);  // the base beside psalms
  EXPECT_EQ(first_step.at(5), 0);
  EXPECT_GT(first_step.at(2), last_step.at(1));  // job once psalms is done
  EXPECT_GT(first_step.at(4), last_step.at(2));  // the later psalms after job
}

TEST(SchedulerTest, FailedStepFinishesItsSequencesWithAnError) {
  Harness h(small_config());
  h.add(1, 4, 10);
  h.add(2, 4, 10);
  StepPlan plan = h.sched.schedule();
  StepResult bad;
  bad.step_id = plan.step_id;
  bad.error = "rank 1 lost";
  const std::vector<SequenceEvent> events = h.sched.on_step_result(plan, bad);
  ASSERT_EQ(events.size(), 2u);
  for (const SequenceEvent& e : events) {
    EXPECT_TRUE(e.finished);
    EXPECT_EQ(e.reason, FinishReason::kError);
    EXPECT_EQ(e.error, "rank 1 lost");
  }
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.sched.stats().num_free_blocks, 64);
  h.sched.check_invariants();
}

TEST(SchedulerTest, WithoutChunkedPrefillAPromptRunsWhole) {
  SchedulerConfig c = small_config();
  c.chunked_prefill = false;
  c.max_num_batched_tokens = 16;
  Harness h(c);
  h.add(1, 5, 20);
  h.add(3, 5, 10);
  h.step();
  h.add(2, 15, 5);  // 15 tokens never fit beside two decodes: waits until one finishes
  for (int i = 0; i < 5; ++i) {
    ResolvedPlan plan = h.step();
    for (const ResolvedStep& s : plan.seqs) EXPECT_NE(s.seq_id, 2u);
  }
  h.run(1000, [](const ResolvedPlan& plan) {
    for (const ResolvedStep& s : plan.seqs)
      if (s.num_computed == 0) { EXPECT_EQ(s.tokens.size(), s.seq_id == 2 ? 15u : 5u); }
  });
  EXPECT_EQ(h.finished[2].reason, FinishReason::kLength);
}

TEST(SchedulerTest, StaticBatchingNeverAdmitsWhileABatchRuns) {
  SchedulerConfig c = small_config();
  c.mode = BatchingMode::kStatic;
  Harness h(c);
  h.add(1, 4, 3);
  h.add(2, 4, 8);
  h.step();
  h.add(3, 4, 2);
  bool batch_done = false;
  h.run(1000, [&](const ResolvedPlan& plan) {
    for (const ResolvedStep& s : plan.seqs) {
      if (s.seq_id == 3) { EXPECT_TRUE(batch_done) << "request 3 joined a running batch"; }
      if (s.seq_id == 2 && s.num_generated == 7) batch_done = true;
    }
  });
  EXPECT_EQ(h.finished.size(), 3u);
}

// Blocks a table still holds (entries a sliding window gave back are -1).
int held_blocks(const ResolvedStep& s) {
  return static_cast<int>(std::count_if(s.block_table.begin(), s.block_table.end(), [](int32_t b) { return b >= 0; }));
}

// A decoding sequence reads its last W keys, a span of W tokens, which meets at most
// ceil((W - 1) / B) + 1 blocks; the decode step writes inside that span. So with a short
// prompt (at most W tokens, one chunk) no step holds more, whatever the output length.
TEST(SchedulerTest, SlidingWindowBoundsTheBlocksASequenceHolds) {
  struct Shape {
    int window, block_size;
  };
  for (const Shape shape : {Shape{16, 4}, Shape{24, 4}, Shape{17, 4}, Shape{6, 4}, Shape{3, 8}, Shape{1, 4},
                            Shape{16, 16}, Shape{5, 1}}) {
    const int w = shape.window, bs = shape.block_size;
    SCOPED_TRACE("window " + std::to_string(w) + ", block size " + std::to_string(bs));
    SchedulerConfig c = small_config();
    c.block_size = bs;
    c.num_blocks = 256;
    c.max_model_len = 1024;
    c.sliding_window = w;
    Harness h(c);
    const int prompt = std::min(w, 3), max_new = 3 * w + 5;
    h.add(1, prompt, max_new);
    const int bound = (w - 1 + bs - 1) / bs + 1;
    ASSERT_LE(bound, (w + bs - 1) / bs + 1);  // ceil(W / B) + 1
    int most = 0;
    h.run(10000, [&](const ResolvedPlan& plan) {
      ASSERT_EQ(plan.seqs.size(), 1u);
      most = std::max(most, held_blocks(plan.seqs[0]));
      EXPECT_LE(held_blocks(plan.seqs[0]), bound) << "at position " << plan.seqs[0].num_computed;
    });
    EXPECT_EQ(most, bound) << "the bound is reached once the window has slid a block";
    std::cout << "[ REPORT   ] window " << w << ", block size " << bs << ": " << prompt + max_new
              << " tokens, at most " << most << " blocks held (bound ceil((W-1)/B)+1 = " << bound
              << ", ceil(W/B)+1 = " << (w + bs - 1) / bs + 1 << "; full attention: "
              << (prompt + max_new - 1 + bs - 1) / bs << ")" << std::endl;
    const std::vector<int32_t>& all = h.exec.tokens(1);
    ASSERT_EQ(all.size(), static_cast<size_t>(prompt + max_new));
    for (int i = 0; i < max_new; ++i) EXPECT_EQ(all[prompt + i], h.exec.token_for(1, i)) << "token " << i;
    EXPECT_EQ(h.sched.stats().num_free_blocks, c.num_blocks);
    EXPECT_GT(h.sched.stats().window_releases, 0u);
    h.sched.block_manager().check_invariants();
  }

  // Without a window nothing is given back: the table only grows, to the whole sequence.
  SchedulerConfig c = small_config();
  c.num_blocks = 256;
  c.max_model_len = 1024;
  Harness h(c);
  h.add(1, 3, 53);
  int most = 0;
  h.run(10000, [&](const ResolvedPlan& plan) {
    EXPECT_EQ(held_blocks(plan.seqs[0]), static_cast<int>(plan.seqs[0].block_table.size()));
    most = std::max(most, held_blocks(plan.seqs[0]));
  });
  EXPECT_EQ(most, 14);  // the last decode writes position 54: blocks 0..13 of 4 tokens
  EXPECT_EQ(h.sched.stats().window_releases, 0u);
  EXPECT_EQ(h.sched.stats().num_free_blocks, c.num_blocks);
}

// A chunk of c tokens also holds its own blocks: the span is then W - 1 + c tokens.
TEST(SchedulerTest, SlidingWindowFreesBlocksDuringAChunkedPrefill) {
  SchedulerConfig c = small_config();
  c.sliding_window = 8;
  c.max_num_batched_tokens = 6;
  Harness h(c);
  h.add(1, 40, 10);
  h.run(1000, [&](const ResolvedPlan& plan) {
    const ResolvedStep& s = plan.seqs[0];
    const int span = 8 - 1 + static_cast<int>(s.tokens.size());
    EXPECT_LE(held_blocks(s), (span - 1 + 3) / 4 + 1) << "at position " << s.num_computed;
    EXPECT_LE(held_blocks(s), 5);
  });
  EXPECT_EQ(h.finished[1].reason, FinishReason::kLength);
  EXPECT_EQ(h.sched.stats().num_free_blocks, c.num_blocks);
}

// Prefix hits longer than the window, copy-on-write of a fully cached prompt, and preemption
// by recompute in a pool too small for every sequence, all under a window: the fake executor
// checks every key a step reads, the invariants every step, the token streams at the end.
TEST(SchedulerTest, SlidingWindowKeepsPrefixSharingAndPreemptionExact) {
  SchedulerConfig c = small_config();
  c.sliding_window = 8;
  c.num_blocks = 13;  // 52 tokens: room for one whole sequence, not for 6 windows of 3 blocks
  c.max_num_batched_tokens = 24;
  Harness h(c);
  const std::vector<int32_t> shared = prompt_of(20, 700);
  h.add_prompt(1, shared, 30);
  h.step();  // computes the prompt and files its 5 full blocks
  for (SeqId id = 2; id <= 6; ++id) h.add_prompt(id, shared, 30);
  ResolvedPlan plan = h.step();
  ASSERT_EQ(plan.seqs.size(), 6u);  // 1 decodes; 2 to 6 reuse the cached prompt
  const ResolvedStep& hit = plan.seqs[1];
  EXPECT_EQ(hit.seq_id, 2u);
  EXPECT_EQ(hit.num_computed, 19);  // only the last prompt token is recomputed, for logits
  // Its first query (position 19) reads keys 12.. on: hit blocks 0..2 went straight back.
  EXPECT_EQ(std::vector<int32_t>(hit.block_table.begin(), hit.block_table.begin() + 3),
            (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(plan.block_copies.size(), 5u);  // block 4 is rewritten while seq 1 still shares it
  h.run();
  EXPECT_GT(h.sched.stats().num_preemptions, 0u);
  EXPECT_GT(h.sched.stats().prefix_hit_tokens, 0u);
  for (SeqId id = 1; id <= 6; ++id) {
    ASSERT_EQ(h.finished[id].reason, FinishReason::kLength);
    const std::vector<int32_t>& all = h.exec.tokens(id);
    ASSERT_EQ(all.size(), 50u);
    for (int i = 0; i < 30; ++i) EXPECT_EQ(all[20 + i], h.exec.token_for(id, i)) << "seq " << id << " token " << i;
  }
  EXPECT_EQ(h.sched.stats().num_free_blocks, c.num_blocks);
}

TEST(SchedulerTest, NegativeSlidingWindowIsRejected) {
  SchedulerConfig c = small_config();
  c.sliding_window = -1;
  const Status st = validate_scheduler_config(c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sliding_window"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera
