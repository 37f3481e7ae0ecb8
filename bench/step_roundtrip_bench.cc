// Step round trip over the real wire: WorkerGroup::execute() -> every rank -> back, with a
// fake step function (no model compute). Workers are forked processes running WorkerLink
// (rank 0 returns one token per sequence, the others status only). RoundTrip: an 8-sequence
// decode step (context ~512, block size 16 -> 33 blocks per sequence). RoundTripLong: the
// steady decode step of 256 sequences of 2,048-token context (128 blocks each), without and
// with a repetition penalty (whose sampler needs every sequence's token history).
// Each case reports p50/p99/mean in microseconds and the frame's bytes per rank as counters;
// Google Benchmark's own time column is the mean. Also times encode+decode of 8- and
// 256-sequence plans.
//
//   build/bin/step_roundtrip_bench [--benchmark_filter=RoundTrip/tcp]
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/wire/messages.h"
#include "coordinator/cluster/worker_group.h"
#include "worker/worker_link.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// The steady decode step of `num_seqs` sequences that have `context` tokens each (block size
// 16): one token each, no new block. With step deltas only what changed travels.
StepPlan decode_plan(uint64_t step_id, int num_seqs, int context = 512) {
  StepPlan p;
  p.step_id = step_id;
  for (int i = 0; i < num_seqs; ++i) {
    SeqStep s;
    s.seq_id = 1000 + i;
    s.version = 20;
    s.tokens = {static_cast<int32_t>(17 + i)};
    s.num_computed = context + i % 16;
    s.table_from = context / 16 + 1;
    s.sample = true;
    p.seqs.push_back(std::move(s));
  }
  return p;
}

// The step that starts those sequences on the executors: the whole block table and the
// sampling state once (with a penalty, the token history too).
StepPlan start_plan(uint64_t step_id, int num_seqs, int context, bool penalty) {
  StepPlan p = decode_plan(step_id, num_seqs, context);
  for (SeqStep& s : p.seqs) {
    const int i = static_cast<int>(s.seq_id - 1000);
    s.version = 1;
    for (int b = 0; b < s.table_from; ++b) s.new_blocks.push_back(i * (s.table_from + 7) + b);
    s.table_from = 0;
    SeqStart& start = s.start.emplace();
    start.sampling.temperature = 0.7f;
    start.sampling.seed = 1234 + i;
    start.prompt_len = s.num_computed - 20;
    if (penalty) {
      start.sampling.repetition_penalty = 1.1f;
      start.history.assign(static_cast<size_t>(s.num_computed), 42);
    }
  }
  return p;
}

StatusOr<StepResult> fake_step(const StepPlan& plan) {
  StepResult r;
  r.step_id = plan.step_id;
  for (const SeqStep& s : plan.seqs)
    if (s.sample) r.tokens.push_back(SampledToken{s.seq_id, static_cast<int32_t>(s.seq_id % 997), -1.0f, {}});
  return r;
}

void add_percentiles(benchmark::State& state, std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  auto pct = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * (us.size() - 1) + 0.5))]; };
  double sum = 0;
  for (double x : us) sum += x;
  state.counters["p50_us"] = pct(0.50);
  state.counters["p99_us"] = pct(0.99);
  state.counters["mean_us"] = sum / us.size();
}

// range(0) = TP world size; range(1) = sequences; range(2) = context; range(3) = penalty.
void BM_RoundTrip(benchmark::State& state, const std::string& transport) {
  const int world = static_cast<int>(state.range(0));
  const int num_seqs = static_cast<int>(state.range(1));
  const int context = static_cast<int>(state.range(2));
  const bool penalty = state.range(3) != 0;
  WorkerGroupOptions o;
  o.bind_address = transport == "ipc" ? "ipc:///tmp/tessera-roundtrip-" + std::to_string(getpid())
                                      : "tcp://127.0.0.1:*";
  o.world_size = world;
  o.heartbeat_interval = std::chrono::milliseconds(1000);
  WorkerGroup group;
  Status st = group.start(o, [](int, const wire::Register&) { return wire::Assignment{}; });
  if (!st.is_ok()) return state.SkipWithError(st.to_string().c_str());
  std::vector<pid_t> children;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      WorkerLinkOptions w;
      w.coordinator_address = group.endpoint();
      w.rank = r;
      w.world_size = world;
      w.heartbeat_interval = std::chrono::milliseconds(1000);
      WorkerLink link(w);
      _exit(link.run(nullptr, fake_step).is_ok() ? 0 : 1);
    }
    children.push_back(pid);
  }
  st = group.wait_until_ready(std::chrono::seconds(20));
  if (!st.is_ok()) {
    for (pid_t c : children) kill(c, SIGKILL);
    return state.SkipWithError(st.to_string().c_str());
  }
  // The first step starts every sequence (once); the timed ones are steady decode steps.
  const StepPlan first = start_plan(0, num_seqs, context, penalty);
  state.counters["start_frame_bytes"] = static_cast<double>(wire::encode(first).size());
  if (StatusOr<StepResult> r = group.execute(first); !r.is_ok()) {
    state.SkipWithError(r.status().to_string().c_str());
    group.shutdown("benchmark failed");
    for (pid_t c : children) waitpid(c, nullptr, 0);
    return;
  }
  StepPlan plan = decode_plan(0, num_seqs, context);
  state.counters["frame_bytes"] = static_cast<double>(wire::encode(plan).size());
  for (int i = 0, warmup = num_seqs > 8 ? 30 : 300; i < warmup; ++i) {
    plan.step_id++;
    (void)group.execute(plan);
  }
  std::vector<double> us;
  us.reserve(state.max_iterations);
  for (auto _ : state) {
    plan.step_id++;
    const auto t0 = Clock::now();
    StatusOr<StepResult> r = group.execute(plan);
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!r.is_ok() || r->tokens.size() != static_cast<size_t>(num_seqs)) {
      state.SkipWithError(r.is_ok() ? "wrong token count" : r.status().to_string().c_str());
      break;
    }
    state.SetIterationTime(elapsed);
    us.push_back(elapsed * 1e6);
  }
  if (!us.empty()) add_percentiles(state, us);
  group.shutdown("benchmark over");
  for (pid_t c : children) waitpid(c, nullptr, 0);
}

void BM_EncodeDecodePlan(benchmark::State& state) {
  const StepPlan plan = decode_plan(1, static_cast<int>(state.range(0)), 2048);
  std::string buf;
  StepPlan out;
  for (auto _ : state) {
    wire::encode(plan, &buf);
    Status st = wire::decode(buf, &out);
    benchmark::DoNotOptimize(st);
  }
  state.counters["bytes"] = static_cast<double>(buf.size());
}
BENCHMARK(BM_EncodeDecodePlan)->Arg(8)->Arg(256);

void BM_EncodePlan(benchmark::State& state) {
  const StepPlan plan = decode_plan(1, static_cast<int>(state.range(0)), 2048);
  std::string buf;
  for (auto _ : state) {
    wire::encode(plan, &buf);
    benchmark::DoNotOptimize(buf.data());
  }
}
BENCHMARK(BM_EncodePlan)->Arg(8)->Arg(256);

void BM_DecodePlan(benchmark::State& state) {
  const std::string buf = wire::encode(decode_plan(1, static_cast<int>(state.range(0)), 2048));
  StepPlan out;
  for (auto _ : state) {
    Status st = wire::decode(buf, &out);
    benchmark::DoNotOptimize(st);
  }
}
BENCHMARK(BM_DecodePlan)->Arg(8)->Arg(256);

// Decoding into a fresh plan every time (what a worker that does not recycle would pay).
void BM_EncodeDecodePlanFresh(benchmark::State& state) {
  const StepPlan plan = decode_plan(1, static_cast<int>(state.range(0)), 2048);
  std::string buf;
  for (auto _ : state) {
    wire::encode(plan, &buf);
    StepPlan out;
    Status st = wire::decode(buf, &out);
    benchmark::DoNotOptimize(st);
  }
}
BENCHMARK(BM_EncodeDecodePlanFresh)->Arg(8)->Arg(256);

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  for (const char* transport : {"tcp", "ipc"}) {
    const auto run = [t = std::string(transport)](benchmark::State& s) { tessera::BM_RoundTrip(s, t); };
    benchmark::RegisterBenchmark((std::string("RoundTrip/") + transport).c_str(), run)
        ->Args({1, 8, 512, 0})
        ->Args({2, 8, 512, 0})
        ->Args({4, 8, 512, 0})
        ->Iterations(5000)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("RoundTripLong/") + transport).c_str(), run)
        ->Args({1, 256, 2048, 0})
        ->Args({2, 256, 2048, 0})
        ->Args({2, 256, 2048, 1})
        ->Iterations(500)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
