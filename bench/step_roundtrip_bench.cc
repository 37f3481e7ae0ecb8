// Step round trip over the real wire: WorkerGroup::execute() -> every rank -> back, with a
// fake step function (no model compute). Workers are forked processes running WorkerLink
// (rank 0 returns one token per sequence, the others status only). The plan is an
// 8-sequence decode step (context ~512, block size 16 -> 33 blocks per sequence).
// Each case reports p50/p99/mean in microseconds as counters; Google Benchmark's own
// time column is the mean. Also times encode+decode of 8- and 256-sequence plans.
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
#include "coordinator/worker_group.h"
#include "worker/worker_link.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

StepPlan decode_plan(uint64_t step_id, int num_seqs) {
  StepPlan p;
  p.step_id = step_id;
  for (int i = 0; i < num_seqs; ++i) {
    SeqStep s;
    s.seq_id = 1000 + i;
    s.tokens = {static_cast<int32_t>(17 + i)};
    s.num_computed = 512 + i;
    for (int b = 0; b < 33; ++b) s.block_table.push_back(i * 40 + b);
    s.sample = true;
    s.sampling.temperature = 0.7f;
    s.sampling.seed = 1234 + i;
    s.num_generated = 20;
    p.seqs.push_back(std::move(s));
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

void BM_RoundTrip(benchmark::State& state, const std::string& transport) {
  const int world = static_cast<int>(state.range(0));
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
  StepPlan plan = decode_plan(0, 8);
  for (int i = 0; i < 300; ++i) {  // warm up
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
    if (!r.is_ok() || r->tokens.size() != 8) {
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
  const StepPlan plan = decode_plan(1, static_cast<int>(state.range(0)));
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
  const StepPlan plan = decode_plan(1, static_cast<int>(state.range(0)));
  std::string buf;
  for (auto _ : state) {
    wire::encode(plan, &buf);
    benchmark::DoNotOptimize(buf.data());
  }
}
BENCHMARK(BM_EncodePlan)->Arg(8)->Arg(256);

void BM_DecodePlan(benchmark::State& state) {
  const std::string buf = wire::encode(decode_plan(1, static_cast<int>(state.range(0))));
  StepPlan out;
  for (auto _ : state) {
    Status st = wire::decode(buf, &out);
    benchmark::DoNotOptimize(st);
  }
}
BENCHMARK(BM_DecodePlan)->Arg(8)->Arg(256);

// Decoding into a fresh plan every time (what a worker that does not recycle would pay).
void BM_EncodeDecodePlanFresh(benchmark::State& state) {
  const StepPlan plan = decode_plan(1, static_cast<int>(state.range(0)));
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
  for (const char* transport : {"tcp", "ipc"})
    benchmark::RegisterBenchmark((std::string("RoundTrip/") + transport).c_str(),
                                 [t = std::string(transport)](benchmark::State& s) { tessera::BM_RoundTrip(s, t); })
        ->Arg(1)
        ->Arg(2)
        ->Arg(4)
        ->Iterations(5000)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
