#include "bench/engine_run.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "coordinator/engine/engine.h"
#include "coordinator/engine/engine_warm_up.h"
#include "worker/executor.h"

namespace tessera {

StatusOr<EngineRunResult> run_through_engine(Transformer& model, Transformer* draft, Backend& backend,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const EngineRunOptions& o) {
  using Clock = std::chrono::steady_clock;
  SchedulerConfig sc;
  sc.block_size = 16;
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  // Room for a group at full length, proposals and the draft's scratch included.
  const int64_t per_seq = static_cast<int64_t>(longest) + o.gen_len + 2 * SeqStep::kMaxDraft + 2;
  sc.num_blocks = static_cast<int>(o.batch * ((per_seq + sc.block_size - 1) / sc.block_size));
  sc.max_num_seqs = o.batch;
  sc.max_num_batched_tokens = std::max<int>(2048, static_cast<int>(longest) * o.batch);
  sc.max_model_len = static_cast<int>(std::max<int64_t>(per_seq, model.config().max_positions));
  sc.sliding_window = model.config().kv_window();
  sc.speculative = o.speculative;
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(sc));
  Executor executor(model, backend, sc.block_size, sc.num_blocks, model.dtype(), draft,
                    o.speculative.draft_min_probability);
  for (const LoraWeights& a : o.adapters) executor.add_lora(a);
  if (o.speculative.enabled()) {
    sc.row_costs = o.row_costs;
    if (sc.row_costs.empty()) {
      TESSERA_ASSIGN_OR_RETURN(sc.row_costs, measure_row_costs(sc, executor, model.config().vocab));
    }
  }
  Engine engine(sc, executor);

  EngineRunResult result;
  result.row_costs = sc.row_costs;
  GenerationTimings& t = result.timings;
  RequestId next_id = 1;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(o.batch)) {
    const size_t end = std::min(prompts.size(), first + static_cast<size_t>(o.batch));
    std::map<SeqId, int> generated;
    for (size_t i = first; i < end; ++i) {
      StopConditions stop;
      stop.ignore_eos = true;
      const RequestId id = next_id++;
      auto request = std::make_shared<Request>(*make_request(prompts[i], o.gen_len, SamplingParams{}, stop));
      if (!o.adapters.empty()) request->lora = o.adapters[(i - first) % o.adapters.size()].name;
      TESSERA_RETURN_IF_ERROR(engine.add_request(id, std::move(request)));
      t.prefill_tokens += static_cast<int64_t>(prompts[i].size());
    }
    const auto start = Clock::now();
    auto decode_start = start;
    bool prefilled = false;
    while (engine.has_work()) {
      const std::vector<SequenceEvent> events = engine.step();
      for (const SequenceEvent& ev : events) {
        if (ev.reason == FinishReason::kError) return internal_error("engine run: " + ev.error);
        generated[ev.seq_id] += static_cast<int>(ev.new_tokens.size());
      }
      if (prefilled) {
        ++t.decode_steps;
      } else if (generated.size() == end - first) {
        prefilled = true;
        decode_start = Clock::now();
        t.prefill_seconds += std::chrono::duration<double>(decode_start - start).count();
      }
    }
    t.decode_seconds += std::chrono::duration<double>(Clock::now() - decode_start).count();
    // Every token after each sequence's first is a decode step's.
    for (const auto& [id, n] : generated) t.decode_tokens += n - 1;
  }
  result.spec = engine.scheduler().stats().spec;
  return result;
}

}  // namespace tessera
