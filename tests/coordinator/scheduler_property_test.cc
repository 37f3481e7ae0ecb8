// Randomized property test of Scheduler + BlockManager against a test executor that checks
// every KV slot a step reads (tests/coordinator/kv_checking_executor.h). Arrivals with shared
// prompt prefixes, aborts (also between schedule() and on_step_result()), stop tokens,
// priorities and tiny pools that force preemption, with and without a sliding window. After
// every step the invariants hold; every request finishes within a bound; at the end every
// block is free again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "coordinator/engine/scheduler.h"
#include "tests/coordinator/kv_checking_executor.h"

namespace tessera {
namespace {

using testing::KvCheckingExecutor;
using testing::ResolvedPlan;
using testing::ResolvedStep;

struct PropertyCase {
  const char* name;
  uint64_t seed;
  SchedulerConfig config;
};

SchedulerConfig make_config(int block_size, int num_blocks, int max_seqs, int budget, bool chunked, bool prefix,
                            int max_model_len, BatchingMode mode = BatchingMode::kContinuous) {
  SchedulerConfig c;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = budget;
  c.chunked_prefill = chunked;
  c.prefix_caching = prefix;
  c.max_model_len = max_model_len;
  c.mode = mode;
  return c;
}

// The same, for a model whose every layer attends to the last `window` keys.
SchedulerConfig windowed(SchedulerConfig c, int window) {
  c.sliding_window = window;
  return c;
}

// Most blocks a sequence can hold during a step that writes `tokens` tokens under a sliding
// window: those spanning its first query's window (window - 1 older keys) plus the new tokens.
int window_block_bound(int window, int tokens, int block_size) {
  const int span = window - 1 + tokens;
  return (span - 1 + block_size - 1) / block_size + 1;
}

struct Outstanding {
  int arrival_step = 0;
  int prompt_len = 0;
  int max_new = 0;
  StopConditions stop;
};

struct Totals {
  int finished = 0, aborted = 0, rejected = 0, max_lifetime = 0;
  int max_decode_blocks = 0;  // most blocks held in a one-token sampling step (sliding window)
};

constexpr int kSteps = 10000;
constexpr int kVocab = 40;        // small, so eos and stop tokens do get sampled
// Generous: strict priorities let a low-priority request wait while higher ones keep
// arriving (the worst seen across these cases is ~2,500 steps, in a 20-block pool).
constexpr int kStarvationBound = 5000;

void check_plan(const ResolvedPlan& plan, const Scheduler& sched, Totals& totals) {
  const SchedulerConfig& c = sched.config();
  int tokens = 0;
  std::vector<SeqId> ids;
  for (const ResolvedStep& s : plan.seqs) {
    ASSERT_FALSE(s.tokens.empty()) << "seq " << s.seq_id;
    tokens += static_cast<int>(s.tokens.size());
    ids.push_back(s.seq_id);
    const Sequence* seq = sched.find(s.seq_id);
    ASSERT_NE(seq, nullptr);
    ASSERT_TRUE(seq->is_running());
    ASSERT_GE(static_cast<int>(s.block_table.size()) * c.block_size,
              s.num_computed + static_cast<int>(s.tokens.size()));
    // The index of the token a step samples (steps that sample nothing carry none: step
    // deltas send no per-step token index, the executor counts tokens fed).
    if (s.sample) { ASSERT_EQ(s.num_generated, seq->num_output()); }
    if (!c.chunked_prefill && s.num_computed == 0) {
      ASSERT_TRUE(s.sample) << "a prompt was split";
    }
    if (c.sliding_window > 0) {
      const int held = static_cast<int>(std::count_if(s.block_table.begin(), s.block_table.end(),
                                                      [](int32_t b) { return b >= 0; }));
      const int n = static_cast<int>(s.tokens.size());
      // Static members reserve their whole prompt up front, so only their steps that reach
      // the end of it (and decodes) are bounded by the window.
      if (c.mode == BatchingMode::kContinuous || s.sample) {
        ASSERT_LE(held, window_block_bound(c.sliding_window, n, c.block_size)) << "seq " << s.seq_id;
      }
      if (n == 1 && s.sample) totals.max_decode_blocks = std::max(totals.max_decode_blocks, held);
    }
  }
  ASSERT_LE(tokens, c.max_num_batched_tokens);
  ASSERT_LE(static_cast<int>(plan.seqs.size()), c.max_num_seqs);
  std::sort(ids.begin(), ids.end());
  ASSERT_TRUE(std::adjacent_find(ids.begin(), ids.end()) == ids.end()) << "a sequence twice in one plan";
  std::vector<int32_t> dsts;
  for (const auto& [src, dst] : plan.block_copies) {
    ASSERT_NE(src, dst);
    dsts.push_back(dst);
  }
  std::sort(dsts.begin(), dsts.end());
  ASSERT_TRUE(std::adjacent_find(dsts.begin(), dsts.end()) == dsts.end()) << "two copies into one block";
}

void run_case(const PropertyCase& pc) {
  SCOPED_TRACE(pc.name);
  const SchedulerConfig& c = pc.config;
  Scheduler sched(c);
  KvCheckingExecutor exec(c.block_size, c.num_blocks, kVocab, c.sliding_window);
  std::mt19937_64 rng(pc.seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };

  // A few shared prompt heads so prefix hits (and full-prompt hits, hence copy-on-write) happen.
  std::vector<std::vector<int32_t>> heads;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> h(static_cast<size_t>(uniform(0, 3) * c.block_size));
    for (int32_t& t : h) t = uniform(0, kVocab - 1);
    heads.push_back(h);
  }
  const int max_outstanding = 3 * c.max_num_seqs;
  std::map<SeqId, Outstanding> live;
  Totals totals;
  SeqId next_id = 1;

  auto on_events = [&](const std::vector<SequenceEvent>& events, int step) {
    exec.apply(events);
    for (const SequenceEvent& e : events) {
      if (!e.finished) continue;
      auto it = live.find(e.seq_id);
      ASSERT_NE(it, live.end());
      const Outstanding& o = it->second;
      const std::vector<int32_t>& all = exec.tokens(e.seq_id);
      const int out = static_cast<int>(all.size()) - o.prompt_len;
      // Preempted or not, a sequence draws exactly the tokens of its own seeded stream.
      for (int i = 0; i < out; ++i) ASSERT_EQ(all[o.prompt_len + i], exec.token_for(e.seq_id, i));
      if (e.reason == FinishReason::kLength) {
        ASSERT_TRUE(out == o.max_new || static_cast<int>(all.size()) == sched.max_sequence_len());
      } else {
        ASSERT_EQ(e.reason, FinishReason::kStop);
        const int32_t last = all.back();
        const bool eos = !o.stop.ignore_eos && o.stop.eos_token_id == last;
        const bool stop = std::count(o.stop.stop_token_ids.begin(), o.stop.stop_token_ids.end(), last) > 0;
        ASSERT_TRUE(eos || stop);
      }
      totals.max_lifetime = std::max(totals.max_lifetime, step - o.arrival_step);
      ++totals.finished;
      exec.forget(e.seq_id);
      live.erase(it);
    }
  };
  auto abort_random = [&]() {
    if (live.empty()) return;
    auto it = live.begin();
    std::advance(it, uniform(0, static_cast<int>(live.size()) - 1));
    ASSERT_TRUE(sched.abort(it->first));
    exec.forget(it->first);
    live.erase(it);
    ++totals.aborted;
  };

  int step = 0;
  for (; step < kSteps || sched.has_work(); ++step) {
    ASSERT_LT(step, kSteps + 20 * kStarvationBound) << "the queue never drained";
    if (step < kSteps) {
      const int arrivals = chance(0.4) ? uniform(1, 2) : 0;
      for (int a = 0; a < arrivals && static_cast<int>(live.size()) < max_outstanding; ++a) {
        std::vector<int32_t> prompt = heads[uniform(0, 3)];
        const int tail = chance(0.2) ? 0 : uniform(1, 2 * c.block_size + 3);
        for (int i = 0; i < tail; ++i) prompt.push_back(uniform(0, kVocab - 1));
        if (prompt.empty()) prompt.push_back(1);
        if (chance(0.01)) prompt.resize(static_cast<size_t>(c.max_model_len + 5), 3);  // never fits
        Outstanding o;
        o.arrival_step = step;
        o.prompt_len = static_cast<int>(prompt.size());
        o.max_new = uniform(1, 24);
        if (chance(0.3)) o.stop.eos_token_id = uniform(0, kVocab - 1);
        o.stop.ignore_eos = chance(0.1);
        if (chance(0.2)) o.stop.stop_token_ids = {uniform(0, kVocab - 1), uniform(0, kVocab - 1)};
        SamplingParams sp;
        sp.temperature = chance(0.5) ? 0.8f : 0.0f;
        if (chance(0.2)) sp.presence_penalty = 0.5f;
        const int priority = chance(0.8) ? 0 : uniform(-1, 2);
        const SeqId id = next_id++;
        const Status st = sched.add_request(id, make_request(prompt, o.max_new, sp, o.stop, priority));
        if (o.prompt_len + 1 > sched.max_sequence_len()) {
          ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
          ++totals.rejected;
          continue;
        }
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        exec.add(id, std::move(prompt));
        live.emplace(id, o);
      }
      if (chance(0.01)) abort_random();
    }
    const bool had_work = sched.has_work();
    StepPlan plan = sched.schedule();
    ASSERT_EQ(had_work, !plan.seqs.empty()) << "work queued but nothing could run (or vice versa)";
    const bool abort_mid_step = step < kSteps && chance(0.005);
    const StepResult result = exec.execute(plan);
    // The plan as the executor saw it, its deltas applied (a refused delta already failed).
    ASSERT_NO_FATAL_FAILURE(check_plan(exec.last_plan(), sched, totals));
    if (abort_mid_step) abort_random();
    if (::testing::Test::HasFailure()) return;
    ASSERT_NO_FATAL_FAILURE(on_events(sched.on_step_result(plan, result), step));
    sched.check_invariants();
    for (const auto& [id, o] : live)
      ASSERT_LE(step - o.arrival_step, kStarvationBound) << "request " << id << " starved";
  }
  EXPECT_TRUE(live.empty());
  const SchedulerStats stats = sched.stats();
  EXPECT_EQ(stats.num_free_blocks, c.num_blocks);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_GT(totals.finished, kSteps / 20);
  std::printf("[ %s ] steps %d finished %d aborted %d rejected %d preemptions %llu prefix-hit tokens %llu "
              "cow %llu max lifetime %d steps\n",
              pc.name, step, totals.finished, totals.aborted, totals.rejected,
              static_cast<unsigned long long>(stats.num_preemptions),
              static_cast<unsigned long long>(stats.prefix_hit_tokens),
              static_cast<unsigned long long>(stats.cow_copies), totals.max_lifetime);
  if (c.sliding_window > 0) {
    EXPECT_GT(stats.window_releases, 0u);
    std::printf("[ %s ] window %d block size %d: %llu blocks freed by the window; one-token steps held at "
                "most %d blocks (bound %d)\n",
                pc.name, c.sliding_window, c.block_size, static_cast<unsigned long long>(stats.window_releases),
                totals.max_decode_blocks, window_block_bound(c.sliding_window, 1, c.block_size));
  } else {
    EXPECT_EQ(stats.window_releases, 0u);
  }
}

class SchedulerPropertyTest : public ::testing::TestWithParam<PropertyCase> {};

TEST_P(SchedulerPropertyTest, InvariantsHoldAndEverythingFinishes) { run_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Seeds, SchedulerPropertyTest,
    ::testing::Values(
        PropertyCase{"tiny_pool", 1, make_config(4, 24, 6, 16, true, true, 96)},
        PropertyCase{"block_size_1", 2, make_config(1, 48, 4, 8, true, true, 40)},
        PropertyCase{"no_chunking", 3, make_config(16, 12, 8, 64, false, true, 256)},
        PropertyCase{"no_prefix_cache", 4, make_config(2, 40, 8, 12, true, false, 64)},
        PropertyCase{"static_batches", 5, make_config(4, 32, 6, 24, true, true, 80, BatchingMode::kStatic)},
        PropertyCase{"roomy", 6, make_config(8, 64, 16, 48, true, true, 128)},
        PropertyCase{"tiny_pool_seed7", 7, make_config(4, 20, 8, 12, true, true, 72)},
        PropertyCase{"tiny_pool_seed8", 8, make_config(4, 24, 6, 16, true, true, 96)},
        PropertyCase{"static_no_chunking", 9, make_config(8, 24, 4, 32, false, true, 64, BatchingMode::kStatic)},
        PropertyCase{"static_tiny_pool", 11, make_config(4, 14, 6, 16, true, true, 48, BatchingMode::kStatic)},
        PropertyCase{"one_seq", 10, make_config(4, 16, 1, 8, true, true, 64)},
        // Windows shorter than the prompt heads and outputs, so blocks leave mid-prefill too.
        PropertyCase{"window_tiny_pool", 21, windowed(make_config(4, 24, 6, 16, true, true, 96), 6)},
        PropertyCase{"window_preempting", 28, windowed(make_config(4, 14, 8, 16, true, true, 56), 10)},
        PropertyCase{"window_block_size_1", 22, windowed(make_config(1, 48, 4, 8, true, true, 40), 3)},
        PropertyCase{"window_under_block", 23, windowed(make_config(8, 32, 6, 16, true, true, 96), 3)},
        PropertyCase{"window_no_chunking", 24, windowed(make_config(16, 12, 8, 64, false, true, 256), 20)},
        PropertyCase{"window_no_prefix_cache", 25, windowed(make_config(2, 40, 8, 12, true, false, 64), 5)},
        PropertyCase{"window_static", 26,
                     windowed(make_config(4, 32, 6, 24, true, true, 80, BatchingMode::kStatic), 8)},
        PropertyCase{"window_static_tiny_pool", 29,
                     windowed(make_config(4, 14, 6, 16, true, true, 48, BatchingMode::kStatic), 7)},
        PropertyCase{"window_one", 27, windowed(make_config(4, 16, 2, 8, true, true, 64), 1)}),
    [](const ::testing::TestParamInfo<PropertyCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tessera
