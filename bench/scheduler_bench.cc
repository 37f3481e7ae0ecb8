// Host cost of continuous batching: Scheduler::schedule() and on_step_result() with N
// running decode sequences in steady state (N = 256 and 1,024; contexts of 512-1,024
// tokens, block size 16, prefix caching on). Only the scheduler calls are timed (manual
// time); the fake executor's result is built outside the timed region. Every 512 steps
// the batch is rebuilt (untimed) so contexts stay in the same range.
//
//   build/bin/scheduler_bench [--benchmark_filter=BM_Schedule/256]
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "coordinator/engine/scheduler.h"

namespace tessera {
namespace {

constexpr int kPromptLen = 512;
constexpr int kStepsPerRound = 512;

StepResult fake_result(const StepPlan& plan) {
  StepResult r;
  r.step_id = plan.step_id;
  for (const SeqStep& s : plan.seqs)
    if (s.sample) r.tokens.push_back(SampledToken{s.seq_id, static_cast<int32_t>(s.num_computed % 1000 + 7), 0.0f, {}});
  return r;
}

// A scheduler whose n sequences have all finished their prefill and are decoding.
std::unique_ptr<Scheduler> decoding_scheduler(int n, uint64_t seed) {
  SchedulerConfig c;
  c.block_size = 16;
  c.max_num_seqs = n;
  c.max_num_batched_tokens = 4096;
  c.max_model_len = 4096;
  // Room for the prompt, the decodes of the prefill phase (<= 128 steps) and of a round.
  c.num_blocks = n * (kPromptLen + kStepsPerRound + 192) / c.block_size + 64;
  auto sched = std::make_unique<Scheduler>(c);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> tok(0, 31999);
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(kPromptLen);
    for (int32_t& t : prompt) t = tok(rng);
    SamplingParams sp;
    sp.temperature = (i % 2) ? 0.8f : 0.0f;
    if (!sched->add_request(static_cast<RequestId>(i + 1), make_request(std::move(prompt), 1 << 20, sp)).is_ok())
      std::abort();
  }
  while (true) {
    const StepPlan plan = sched->schedule();
    sched->on_step_result(plan, fake_result(plan));
    bool all_decoding = sched->stats().num_waiting == 0;
    for (const SeqStep& s : plan.seqs) all_decoding = all_decoding && s.tokens.size() == 1;
    if (all_decoding && !plan.seqs.empty()) break;
  }
  return sched;
}

void run(benchmark::State& state, bool with_result) {
  const int n = static_cast<int>(state.range(0));
  std::unique_ptr<Scheduler> sched = decoding_scheduler(n, 1);
  int steps = 0;
  uint64_t seqs = 0;
  for (auto _ : state) {
    if (steps == kStepsPerRound) {
      sched = decoding_scheduler(n, static_cast<uint64_t>(steps) + seqs);
      steps = 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    StepPlan plan = sched->schedule();
    auto t1 = std::chrono::steady_clock::now();
    double seconds = std::chrono::duration<double>(t1 - t0).count();
    const StepResult result = fake_result(plan);
    if (with_result) {
      t1 = std::chrono::steady_clock::now();
      auto events = sched->on_step_result(plan, result);
      benchmark::DoNotOptimize(events.data());
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    } else {
      sched->on_step_result(plan, result);
    }
    state.SetIterationTime(seconds);
    if (static_cast<int>(plan.seqs.size()) != n) {
      state.SkipWithError(("step " + std::to_string(steps) + " scheduled " + std::to_string(plan.seqs.size()) + " sequences").c_str());
      break;
    }
    seqs += plan.seqs.size();
    ++steps;
  }
  state.counters["seqs_per_step"] = benchmark::Counter(static_cast<double>(seqs) / state.iterations());
}

void BM_Schedule(benchmark::State& state) { run(state, false); }
void BM_ScheduleAndResult(benchmark::State& state) { run(state, true); }

// Continuous vs static batching on one workload: 1,024 requests arrive at once (prompts
// 64-512 tokens, outputs 16-512 tokens, same seed for both modes) and run to completion.
// Counters: steps to drain, and mean sequences / tokens per step. With a step's cost
// roughly fixed by the weights it streams (decode is memory bound), fewer steps is higher
// throughput: the steps ratio estimates the continuous-over-static speed-up.
void BM_Drain(benchmark::State& state) {
  const bool is_static = state.range(0) == 1;
  for (auto _ : state) {
    SchedulerConfig c;
    c.block_size = 16;
    c.num_blocks = 16384;
    c.max_num_seqs = 256;
    c.max_num_batched_tokens = 4096;
    c.mode = is_static ? BatchingMode::kStatic : BatchingMode::kContinuous;
    Scheduler sched(c);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> prompt_len(64, 512), output_len(16, 512);
    for (RequestId id = 1; id <= 1024; ++id) {
      std::vector<int32_t> prompt(static_cast<size_t>(prompt_len(rng)), static_cast<int32_t>(id));
      if (!sched.add_request(id, make_request(std::move(prompt), output_len(rng))).is_ok()) std::abort();
    }
    double steps = 0, seqs = 0, tokens = 0;
    while (sched.has_work()) {
      const StepPlan plan = sched.schedule();
      for (const SeqStep& s : plan.seqs) tokens += static_cast<double>(s.tokens.size());
      seqs += static_cast<double>(plan.seqs.size());
      steps += 1;
      sched.on_step_result(plan, fake_result(plan));
    }
    state.counters["steps"] = steps;
    state.counters["seqs_per_step"] = seqs / steps;
    state.counters["tokens_per_step"] = tokens / steps;
  }
}

BENCHMARK(BM_Drain)->ArgName("static")->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Schedule)->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ScheduleAndResult)->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
