#include "coordinator/engine/engine_warm_up.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/engine/engine.h"
#include "coordinator/engine/request.h"

namespace tessera {
namespace {

// A longer prompt runs the same kernels on the same weights and threads; what it adds is
// larger activation buffers, a few MB that the first long prompt faults in within
// milliseconds. 512 made the warm-up of a ~1.1B q4_K_M model 2.8 s of a 6-7 s start-up on 2
// cores; 128 takes about a quarter of that.
constexpr int kLongestWarmUpPrompt = 128;

// measure_row_costs: steps of 1, 2, 4, ... rows up to kMostMeasuredRows, or until a step
// takes kComputeBoundFactor times a one-row step's; each the median of kRowCostRepeats
// (a 2-core host's steps vary by ±10%, and now and then by 2x). On the ~300 MB padded
// kjv-llama on 2 CPU cores it takes about a second.
constexpr int kMostMeasuredRows = 256;
constexpr double kComputeBoundFactor = 4.0;
constexpr int kRowCostRepeats = 5;

// Arbitrary but fixed ids spread over the vocabulary.
std::vector<int32_t> warm_prompt(int length, int64_t vocab, int salt) {
  std::vector<int32_t> ids(static_cast<size_t>(length));
  for (int i = 0; i < length; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919LL + salt * 104729LL + 11) % vocab);
  }
  return ids;
}

// Runs requests to their end in an engine of its own, under ids from the top of the id
// space; drop_all then has the executors forget them.
class EngineRequests {
 public:
  explicit EngineRequests(Engine& engine) : engine_(engine) {}

  // The steps it took. Before each step `stop` (when set) may end the run, its requests left
  // unfinished (drop_all still has the executors forget them).
  StatusOr<int> run(const std::vector<std::shared_ptr<const Request>>& requests,
                    const std::function<bool()>& stop = {}) {
    for (const auto& r : requests) {
      TESSERA_RETURN_IF_ERROR(engine_.add_request(next_id_, r));
      ids_.push_back(next_id_--);
    }
    int steps = 0;
    while (engine_.has_work()) {
      if (stop && stop()) {
        stopped_ = true;
        break;
      }
      for (const SequenceEvent& e : engine_.step()) {
        if (e.finished && e.reason == FinishReason::kError) return internal_error("warm-up step failed: " + e.error);
      }
      ++steps;
    }
    return steps;
  }

  // The executors keep a finished sequence's state until a plan drops it.
  Status drop_all(StepExecutor& executor) {
    StepPlan drop;
    drop.step_id = engine_.steps() + 1;
    for (RequestId id : ids_) drop.dropped.push_back(choice_seq_id(id, 0));
    ids_.clear();
    return executor.execute(drop).status();
  }

  bool stopped() const { return stopped_; }

 private:
  Engine& engine_;
  bool stopped_ = false;
  std::vector<RequestId> ids_;
  RequestId next_id_ = kMaxRequestId;
};

}  // namespace

StatusOr<WarmUpReport> warm_up_executor(const SchedulerConfig& config, StepExecutor& executor, int64_t vocab,
                                        Pooling embeddings_only, const std::function<bool()>& cut_short) {
  WarmUpReport report;
  if (vocab <= 0) return report;
  const auto started = std::chrono::steady_clock::now();
  SchedulerConfig sc = config;
  sc.prefix_caching = false;  // its prompts must not stay behind as cached blocks
  Engine engine(sc, executor);
  // Room for the prompt and two generated tokens, within the model and the pool.
  const int pool_tokens = std::max(0, (sc.num_blocks - 1) * sc.block_size);
  // At most kLongestWarmUpPrompt: the whole default budget (4,096 tokens) took 6.8 s on the
  // ~100M model on 2 CPU cores, attention being quadratic in it.
  const int longest =
      std::min({sc.max_num_batched_tokens, kLongestWarmUpPrompt, sc.max_model_len - 2, pool_tokens - 2});
  // Short requests of 4 prompt + 3 generated tokens, each within one block (two counted).
  const int batch =
      std::clamp(std::min(sc.max_num_seqs, 8), 1, std::max(1, pool_tokens / std::max(1, 2 * sc.block_size)));
  constexpr int kShortPrompt = 4, kShortOutput = 3;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  StopConditions no_stop;
  no_stop.ignore_eos = true;
  EngineRequests runner(engine);
  auto run = [&](std::vector<std::shared_ptr<const Request>> requests) -> Status {
    if (embeddings_only != Pooling::kNone) {
      for (auto& r : requests) {
        auto embedding = std::make_shared<Request>(*r);
        embedding->pooling = embeddings_only;
        r = std::move(embedding);
      }
    }
    TESSERA_ASSIGN_OR_RETURN(const int steps, runner.run(requests, cut_short));
    report.steps += steps;
    return Status::ok();
  };
  // The short steps first: a request that cuts the warm-up short waits for the step running
  // when it comes, and the long prefill is the longest step by far. First of all one request
  // alone, whose steps are a first request's: the first step of a process is its slowest
  // (first touches of activation buffers, thread pools starting), and that of the whole batch
  // took 0.43-0.57 s of a ~1.1B q4_K_M model's start against 0.12-0.37 s for one sequence,
  // delaying a first request that came meanwhile by as much (tessera-serve to its first
  // answer: 1.02-1.43 s, median 1.39, against 0.84-1.52, median 1.15, 2026-12-07).
  if (sc.max_model_len >= kShortPrompt + kShortOutput && pool_tokens >= kShortPrompt + kShortOutput) {
    if (batch > 1) {
      TESSERA_RETURN_IF_ERROR(
          run({make_request(warm_prompt(kShortPrompt, vocab, batch + 1), kShortOutput, greedy, no_stop)}));
    }
    std::vector<std::shared_ptr<const Request>> short_ones;
    for (int i = 0; i < batch; ++i) {
      short_ones.push_back(make_request(warm_prompt(kShortPrompt, vocab, i + 1), kShortOutput, greedy, no_stop));
    }
    if (!runner.stopped()) TESSERA_RETURN_IF_ERROR(run(short_ones));
    if (!runner.stopped()) report.decode_batch = batch;
  }
  if (longest >= 1 && !runner.stopped()) {
    TESSERA_RETURN_IF_ERROR(run({make_request(warm_prompt(longest, vocab, 0), 2, greedy, no_stop)}));
    if (!runner.stopped()) report.prompt_tokens = longest;
  }
  report.cut_short = runner.stopped();
  TESSERA_RETURN_IF_ERROR(runner.drop_all(executor));
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

StatusOr<RowCostCurve> measure_row_costs(const SchedulerConfig& config, StepExecutor& executor, int64_t vocab) {
  RowCostCurve curve;
  if (vocab <= 0) return curve;
  SchedulerConfig sc = config;
  sc.prefix_caching = false;
  sc.speculative = SpeculativeConfig{};  // plain steps: their rows are what is measured
  Engine engine(sc, executor);
  EngineRequests runner(engine);
  const int pool_tokens = std::max(0, (sc.num_blocks - 1) * sc.block_size);
  const int most_rows = std::min({sc.max_num_batched_tokens, sc.max_model_len - 1, pool_tokens - 1, kMostMeasuredRows});
  // Every row scores the next token as a checked proposal's does (prompt logprobs: the LM
  // head and a pass over the vocabulary per row); one generated token, so one step each.
  SamplingParams scored;
  scored.temperature = 0.0f;
  scored.prompt_logprobs = 0;
  StopConditions no_stop;
  no_stop.ignore_eos = true;
  int salt = 1000;
  auto time_step = [&](int rows) -> StatusOr<double> {
    TESSERA_RETURN_IF_ERROR(runner.run({make_request(warm_prompt(rows, vocab, ++salt), 1, scored, no_stop)}).status());
    return engine.last_step_target_seconds();
  };
  // A first pass finds the sizes: doubling until a step takes kComputeBoundFactor times one
  // row's (past that every row costs its full share; the curve's last slope says the rest).
  std::vector<int> sizes;
  std::vector<std::vector<double>> times;
  for (int rows = 1; rows <= most_rows; rows *= 2) {
    TESSERA_ASSIGN_OR_RETURN(const double t, time_step(rows));
    sizes.push_back(rows);
    times.push_back({t});
    if (t >= kComputeBoundFactor * times.front().front()) break;
  }
  // Further rounds over every size in turn, so that a disturbance of the host lands on one
  // sample of several sizes rather than on every sample of one.
  for (int round = 1; round < kRowCostRepeats; ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(const double t, time_step(sizes[i]));
      times[i].push_back(t);
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<double>& v = times[i];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    curve.add(sizes[i], v[v.size() / 2]);
  }
  TESSERA_RETURN_IF_ERROR(runner.drop_all(executor));
  return curve;
}

}  // namespace tessera
