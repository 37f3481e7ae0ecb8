// batching_bench: generated tokens/s of the in-process engine (Engine + Scheduler +
// Executor) at several concurrency levels, and continuous vs. static batching on one
// Poisson arrival trace, replayed in real time. A plain program (not Google Benchmark):
// each measurement is one long run.
//
//   build/bin/batching_bench --model DIR [--dtype bfloat16] [--concurrency 1,8,32,64]
//       [--prompt-len 64] [--gen-len 32] [--trace-requests 64] [--rate 4] [--json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "coordinator/engine/engine.h"
#include "kernels/backend.h"
#include "worker/executor.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct TraceRequest {
  double arrival_s = 0;
  std::vector<int32_t> prompt;
  int max_new_tokens = 0;
};

struct RunResult {
  double seconds = 0;
  int64_t generated = 0;
  double mean_latency_s = 0;  // arrival -> last token
  uint64_t steps = 0;
  uint64_t preemptions = 0;
};

// Replays `trace` (arrival times relative to the start) through a fresh engine in real time.
RunResult replay(Transformer& model, Backend& backend, const std::vector<TraceRequest>& trace,
                 SchedulerConfig sc) {
  Executor executor(model, backend, sc.block_size, sc.num_blocks, model.dtype());
  Engine engine(sc, executor);
  std::map<SeqId, size_t> which;
  std::vector<double> done_at(trace.size(), 0);
  RunResult r;
  size_t next = 0;
  const auto start = Clock::now();
  while (next < trace.size() || engine.has_work()) {
    const double now = since(start);
    while (next < trace.size() && trace[next].arrival_s <= now) {
      auto req = std::make_shared<Request>();
      req->prompt = trace[next].prompt;
      req->max_tokens = trace[next].max_new_tokens;
      req->stop.ignore_eos = true;
      const RequestId id = next + 1;
      if (Status st = engine.add_request(id, std::move(req)); !st.is_ok()) {
        std::cerr << st.to_string() << std::endl;
        std::exit(1);
      }
      which[id] = next++;
    }
    if (!engine.has_work()) {  // idle until the next arrival
      std::this_thread::sleep_for(std::chrono::duration<double>(trace[next].arrival_s - now));
      continue;
    }
    for (const SequenceEvent& ev : engine.step()) {
      r.generated += static_cast<int64_t>(ev.new_tokens.size());
      if (ev.finished) done_at[which[ev.seq_id]] = since(start);
    }
  }
  r.seconds = since(start);
  for (size_t i = 0; i < trace.size(); ++i) r.mean_latency_s += (done_at[i] - trace[i].arrival_s) / trace.size();
  r.steps = engine.steps();
  r.preemptions = engine.scheduler().stats().num_preemptions;
  return r;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t vocab, int len) {
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(len);
  for (auto& t : p) t = id(rng);
  return p;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  std::string model_dir, dtype_name_arg = "bfloat16", concurrency_arg = "1,8,32,64";
  int prompt_len = 64, gen_len = 32, trace_requests = 64, threads = 0;
  double rate = 4.0;
  bool json = false;
  CLI::App app{"batching_bench: engine throughput vs concurrency; continuous vs static batching"};
  app.add_option("--model", model_dir, "model folder")->required();
  app.add_option("--dtype", dtype_name_arg, "float32, bfloat16 or float16")->capture_default_str();
  app.add_option("--concurrency", concurrency_arg, "comma-separated concurrent sequence counts")->capture_default_str();
  app.add_option("--prompt-len", prompt_len, "prompt tokens (concurrency runs)")->capture_default_str();
  app.add_option("--gen-len", gen_len, "generated tokens per sequence (concurrency runs)")->capture_default_str();
  app.add_option("--trace-requests", trace_requests, "requests in the Poisson trace (0 = skip)")->capture_default_str();
  app.add_option("--rate", rate, "Poisson arrival rate, requests/s")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0 = all)");
  app.add_flag("--json", json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);
  init_logging("bench", spdlog::level::warn);

  auto dtype = parse_float_dtype(dtype_name_arg);
  if (!dtype) {
    std::cerr << "batching_bench: unknown --dtype " << dtype_name_arg << std::endl;
    return 1;
  }
  auto kernels = kernel_options_from_environment();
  if (!kernels.is_ok()) {
    std::cerr << "batching_bench: " << kernels.status().to_string() << std::endl;
    return 1;
  }
  auto backend = make_backend("cpu", BackendOptions{threads, 0, kernels.value()});
  ModelLoadOptions lo;
  lo.dtype = *dtype;
  auto model = Transformer::load(model_dir, lo, *backend.value());
  if (!model.is_ok()) {
    std::cerr << "batching_bench: " << model.status().to_string() << std::endl;
    return 1;
  }
  Transformer& m = *model.value();
  const int64_t vocab = m.config().vocab;
  nlohmann::json out;
  std::mt19937 rng(42);

  // 1. Throughput at fixed concurrency: C requests, all present from the start.
  std::stringstream cs(concurrency_arg);
  for (std::string item; std::getline(cs, item, ',');) {
    const int c = std::stoi(item);
    std::vector<TraceRequest> batch(c);
    for (auto& r : batch) {
      r.prompt = random_prompt(rng, vocab, prompt_len);
      r.max_new_tokens = gen_len;
    }
    SchedulerConfig sc;
    sc.num_blocks = c * ((prompt_len + gen_len + sc.block_size - 1) / sc.block_size);
    sc.max_model_len = prompt_len + gen_len;
    RunResult r = replay(m, *backend.value(), batch, sc);
    const double tok_s = r.generated / r.seconds;
    out["concurrency"].push_back({{"sequences", c}, {"generated_tok_s", tok_s}, {"seconds", r.seconds}});
    if (!json) std::cout << "concurrency " << c << ": " << tok_s << " generated tok/s (" << r.seconds << " s)" << std::endl;
  }

  // 2. One Poisson trace (random prompt/output lengths), continuous vs static batching.
  if (trace_requests > 0) {
    std::vector<TraceRequest> trace(trace_requests);
    std::exponential_distribution<double> gap(rate);
    std::uniform_int_distribution<int> plen(16, 128), olen(8, 64);
    double t = 0;
    int max_len = 0;
    for (auto& r : trace) {
      t += gap(rng);
      r.arrival_s = t;
      r.prompt = random_prompt(rng, vocab, plen(rng));
      r.max_new_tokens = olen(rng);
      max_len = std::max<int>(max_len, static_cast<int>(r.prompt.size()) + r.max_new_tokens);
    }
    for (BatchingMode mode : {BatchingMode::kContinuous, BatchingMode::kStatic}) {
      SchedulerConfig sc;
      sc.mode = mode;
      sc.max_num_seqs = 32;
      sc.num_blocks = 32 * ((max_len + sc.block_size - 1) / sc.block_size);
      sc.max_model_len = max_len;
      RunResult r = replay(m, *backend.value(), trace, sc);
      const char* name = mode == BatchingMode::kContinuous ? "continuous" : "static";
      out["trace"][name] = {{"generated_tok_s", r.generated / r.seconds},
                            {"makespan_s", r.seconds},
                            {"mean_latency_s", r.mean_latency_s},
                            {"steps", r.steps}};
      if (!json) {
        std::cout << name << " batching: " << r.generated / r.seconds << " generated tok/s, makespan " << r.seconds
                  << " s, mean latency " << r.mean_latency_s << " s, " << r.steps << " steps" << std::endl;
      }
    }
    out["trace"]["continuous_over_static"] =
        out["trace"]["continuous"]["generated_tok_s"].get<double>() / out["trace"]["static"]["generated_tok_s"].get<double>();
    out["trace"]["requests"] = trace_requests;
    out["trace"]["rate"] = rate;
    if (!json) std::cout << "continuous / static throughput: " << out["trace"]["continuous_over_static"] << std::endl;
  }
  if (json) std::cout << out.dump() << std::endl;
  return 0;
}
