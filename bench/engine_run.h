#pragma once
// tessera-bench's serving-path run (--engine, and every --speculative run): the prompts go
// through Engine + Scheduler + Executor in this process, as the server runs them, `batch`
// at a time, so speculative decoding (n-gram or a draft model) is measured where it runs.
// Prefill time is until every sequence of a group has its first token; decode time the rest.
#include <cstdint>
#include <vector>

#include "common/speculative_config.h"
#include "common/status.h"
#include "coordinator/engine/scheduler.h"
#include "kernels/backend.h"
#include "worker/generator.h"
#include "worker/lora_weights.h"
#include "worker/transformer.h"

namespace tessera {

struct EngineRunOptions {
  int batch = 1;     // sequences run together (a group); groups run one after another
  int gen_len = 32;  // tokens generated per sequence (EOS ignored)
  SpeculativeConfig speculative;
  // With speculation: a step's time by its rows (SchedulerConfig::row_costs); measured on
  // this executor first (measure_row_costs) when empty, as the server does at start-up.
  RowCostCurve row_costs;
  // LoRA adapters the executor holds; sequence i of each group runs with adapters[i % size]
  // (none: every sequence runs with the base alone).
  std::vector<LoraWeights> adapters;
};

struct EngineRunResult {
  GenerationTimings timings;
  SpecDecodeStats spec;
  RowCostCurve row_costs;  // the one the run used
};

// `draft`: the executor's draft model (speculative.method draft), else null.
StatusOr<EngineRunResult> run_through_engine(Transformer& model, Transformer* draft, Backend& backend,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const EngineRunOptions& options);

}  // namespace tessera
