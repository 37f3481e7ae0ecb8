#include "common/logging.h"
#include "tools/lib/local_executor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "common/config.h"
#include "common/private_temp_dir.h"
#include "coordinator/cluster/cluster.h"
#include "coordinator/cluster/local_workers.h"
#include "kernels/backend.h"
#include "worker/draft_model.h"
#include "worker/executor.h"
#include "worker/transformer.h"
#include "worker/worker_runtime.h"

namespace tessera {
namespace {

class InProcessExecutor final : public LocalExecutor {
 public:
  StepExecutor& executor() override { return *executor_; }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<Transformer> draft_;  // before executor_: the executor's draft pool uses it
  std::unique_ptr<Executor> executor_;
};

// N tessera-worker processes on this host, driven through the coordinator's WorkerGroup.
class WorkerGroupExecutor final : public LocalExecutor {
 public:
  StepExecutor& executor() override { return *group_; }
  ~WorkerGroupExecutor() override {
    if (group_) group_->shutdown("run finished");
    workers_.stop();
    dir_.remove();
  }

  PrivateTempDir dir_;  // the workers' config and control socket
  std::unique_ptr<WorkerGroup> group_;
  LocalWorkers workers_;
};

StatusOr<std::unique_ptr<LocalExecutor>> start_in_process(const LocalExecutorOptions& o, const SchedulerConfig& sc) {
  auto rt = std::make_unique<InProcessExecutor>();
  // No configuration here: the kernels' defaults with the TESSERA_CPU_* variables over them.
  TESSERA_ASSIGN_OR_RETURN(const KernelOptions kernels, kernel_options_from_environment());
  TESSERA_ASSIGN_OR_RETURN(rt->backend_, make_backend(o.backend, BackendOptions{o.threads, 0, kernels}));
  ModelLoadOptions lo;
  lo.dtype = o.dtype;
  lo.kernel_inject = o.kernel_inject;
  lo.quant = o.quant;
  lo.residency = o.residency;
  lo.max_context = sc.max_model_len;
  TESSERA_ASSIGN_OR_RETURN(rt->model_, Transformer::load(o.model, lo, *rt->backend_));
  if (const std::string plan = rt->model_->streaming_plan(); !plan.empty()) TESSERA_LOG_INFO("{}", plan);
  if (!o.draft_model.empty()) {
    TESSERA_RETURN_IF_ERROR(check_draft_model(o.draft_model, rt->model_->config(), sc.max_model_len).status());
    TESSERA_ASSIGN_OR_RETURN(rt->draft_, load_draft_model(o.draft_model, lo, *rt->backend_));
  }
  rt->executor_ = std::make_unique<Executor>(*rt->model_, *rt->backend_, sc.block_size, sc.num_blocks,
                                             rt->model_->dtype(), rt->draft_.get(),
                                             sc.speculative.draft_min_probability);
  rt->executor_->set_max_loras(sc.max_loras);
  for (const auto& [name, dir] : o.lora_adapters) {
    TESSERA_ASSIGN_OR_RETURN(LoraWeights adapter, load_lora_weights(name, dir, o.model, rt->model_->weights(),
                                                                    rt->model_->dtype(), o.lora_max_rank));
    rt->executor_->add_lora(std::move(adapter));
  }
  return std::unique_ptr<LocalExecutor>(std::move(rt));
}

StatusOr<std::unique_ptr<LocalExecutor>> start_workers(const LocalExecutorOptions& o, const SchedulerConfig& sc) {
  auto rt = std::make_unique<WorkerGroupExecutor>();
  // A fresh private folder (mode 0700) for the workers' configuration and control socket;
  // one a kill -9 left behind is removed by the next run (common/private_temp_dir.h).
  remove_stale_private_temp_dirs(o.program);
  TESSERA_ASSIGN_OR_RETURN(rt->dir_, PrivateTempDir::create(o.program));
  TesseraConfig c;
  c.source = o.program;
  c.model.path = std::filesystem::absolute(o.model).string();
  c.model.dtype = o.dtype;
  c.model.kernel_inject = o.kernel_inject;
  c.model.quantization = o.quant.kind;
  c.model.quantization_group = o.quant.group;
  c.model.quantization_rules = o.quant.rules;
  c.model.bf16_coding = o.quant.bf16_coding;
  c.model.weights_memory_budget = o.residency.budget;
  c.model.weights_spill_dir = o.residency.spill_dir;
  if (!o.residency.cache_dir.empty()) c.model.weights_cache_dir = std::filesystem::absolute(o.residency.cache_dir).string();
  c.model.weights_prefetch_layers = o.residency.prefetch_layers;
  c.model.weights_streaming = o.residency.streaming;
  c.parallel.tensor_parallel = o.tensor_parallel;
  c.worker.collectives = o.collectives;
  c.worker.collectives_address = "127.0.0.1";  // every rank is a process of this host
  if (!o.draft_model.empty()) {
    c.speculative.method = SpeculativeConfig::Method::kDraft;
    c.speculative.draft_model = std::filesystem::absolute(o.draft_model).string();
    c.speculative.draft_min_probability = sc.speculative.draft_min_probability;
  }
  c.scheduler.max_model_len = sc.max_model_len;  // the workers' served context (LongRoPE's factors)
  for (const auto& [name, dir] : o.lora_adapters) c.lora.adapters[name] = std::filesystem::absolute(dir).string();
  c.lora.max_rank = o.lora_max_rank;
  c.lora.max_loras = sc.max_loras;
  c.cache.block_size = sc.block_size;
  c.cache.num_blocks = sc.num_blocks;
  // The workers plan their activation memory for the steps this scheduler makes (a step runs
  // at most as many sequences as tokens: the configuration insists on it, and the plan is the
  // same).
  c.scheduler.max_num_batched_tokens = sc.max_num_batched_tokens;
  c.scheduler.max_num_seqs = std::min(sc.max_num_seqs, sc.max_num_batched_tokens);
  c.server.control = "ipc://" + rt->dir_.path() + "/control.ipc";
  c.worker.backend = o.backend == "cuda" ? BackendKind::kCuda : BackendKind::kCpu;
  c.worker.threads = o.threads;
  TESSERA_RETURN_IF_ERROR(merge_deepspeed_env(c));
  TESSERA_RETURN_IF_ERROR(validate_config(c));
  TESSERA_RETURN_IF_ERROR(kernel_options_from_environment(c.worker.cpu).status());
  // Checked here, once, rather than have every worker fail with the same message.
  TESSERA_RETURN_IF_ERROR(check_deployment(c).status());
  TESSERA_ASSIGN_OR_RETURN(const std::string config_path, rt->dir_.write_file("config.yaml", worker_config_yaml(c)));
  ClusterOptions co;
  co.config = c;
  co.kv_dtype = o.dtype;
  co.group_name = o.program + "-" + std::to_string(getpid());
  TESSERA_ASSIGN_OR_RETURN(Cluster cluster, start_cluster(co));
  rt->group_ = std::move(cluster.group);
  // Workers log warnings only, unless the user asked for more.
  setenv("TESSERA_LOG_LEVEL", "warn", /*overwrite=*/0);
  TESSERA_RETURN_IF_ERROR(rt->workers_.start(executable_dir() + "/tessera-worker", config_path, o.tensor_parallel));
  TESSERA_RETURN_IF_ERROR(rt->group_->wait_until_ready(std::chrono::minutes(10)));
  return std::unique_ptr<LocalExecutor>(std::move(rt));
}

}  // namespace

StatusOr<std::unique_ptr<LocalExecutor>> LocalExecutor::start(const LocalExecutorOptions& options,
                                                              const SchedulerConfig& sc) {
  if (options.tensor_parallel < 1) return invalid_argument("--tensor-parallel must be at least 1");
  if (options.tensor_parallel == 1) return start_in_process(options, sc);
  return start_workers(options, sc);
}

}  // namespace tessera
