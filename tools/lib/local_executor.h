#pragma once
// The model runner of the one-process command-line programs (tessera-generate,
// tessera-perplexity): the model in this process for tensor-parallel size 1, or N local
// tessera-worker processes driven through the coordinator's WorkerGroup (exactly as a
// deployment runs them) for N > 1. Either way the caller gets one StepExecutor for its
// Engine, so these programs run the serving path, not a copy of it.
#include <map>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/dtype.h"
#include "common/quantization.h"
#include "common/status.h"
#include "common/step_executor.h"
#include "coordinator/engine/scheduler.h"
#include "worker/weight_residency.h"

namespace tessera {

struct LocalExecutorOptions {
  std::string model;           // as --model: a Hugging Face folder or a DeepSpeed checkpoint JSON
  DType dtype = DType::kF32;
  bool kernel_inject = true;
  int tensor_parallel = 1;
  CollectivesKind collectives = CollectivesKind::kAuto;  // worker.collectives (over loopback for Gloo)
  std::string backend = "cpu";  // "cpu" | "cuda"
  int threads = 0;              // CPU threads per process; 0 = all cores
  QuantizationOptions quant;
  // model.weights_memory_budget, weights_spill_dir, weights_prefetch_layers (the CPU backend).
  WeightResidencyOptions residency;
  // speculative.draft_model when the draft method is on: loaded beside the model (worker/draft_model.h).
  std::string draft_model;
  // lora.adapters: name -> PEFT folder, loaded beside the model (worker/lora_weights.h).
  std::map<std::string, std::string> lora_adapters;
  int lora_max_rank = 64;
  std::string program = "tessera";  // names the workers' private temporary folder
};

class LocalExecutor {
 public:
  // Loads the model (TP 1) or starts the workers and waits until every rank has loaded its
  // shard (TP > 1). `sc` gives the KV pool (block size, number of blocks).
  static StatusOr<std::unique_ptr<LocalExecutor>> start(const LocalExecutorOptions& options,
                                                        const SchedulerConfig& sc);
  virtual ~LocalExecutor() = default;
  virtual StepExecutor& executor() = 0;
};

}  // namespace tessera
