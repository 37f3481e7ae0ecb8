#include "worker/worker_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "common/communicator.h"
#include "common/zmq/curve_keys.h"
#include "common/logging.h"
#include "kernels/backend.h"
#include "worker/activation_memory.h"
#include "worker/auto_tp.h"
#include "worker/cpu_share.h"
#include "worker/draft_model.h"
#include "worker/executor.h"
#include "worker/model_weights.h"
#include "worker/collective_group.h"
#include "worker/transformer.h"
#include "worker/worker_link.h"
#include "worker/model_checkpoint.h"

namespace tessera {
namespace {

// A group whose output projection is kept whole is computed whole on every rank (that is
// what the loader does), so its input projections are kept too: the printed plan then says
// what each rank really holds.
void keep_inputs_of_kept_groups(const ModelConfig& c, TpPlan& plan) {
  const ArchSpec& a = *c.arch;
  auto keep_if_output_kept = [&](const std::vector<TensorRole>& inputs, TensorRole output, int layer, int expert) {
    const std::string out = tensor_name(a.name_of(output), layer, expert);
    if (a.name_of(output).empty() || plan.role_of(out) != TpRole::kKeep) return;
    for (TensorRole r : inputs) {
      if (a.name_of(r).empty()) continue;
      const std::string in = tensor_name(a.name_of(r), layer, expert);
      if (plan.roles.count(in)) plan.roles[in] = TpRole::kKeep;
      if (plan.roles.count(bias_name(in))) plan.roles[bias_name(in)] = TpRole::kKeep;
    }
  };
  for (int l = 0; l < c.layers; ++l) {
    keep_if_output_kept({TensorRole::kQ, TensorRole::kK, TensorRole::kV, TensorRole::kQkv}, TensorRole::kO, l, -1);
    if (c.layer[l].moe) {
      for (int e = 0; e < c.num_experts; ++e) {
        keep_if_output_kept({TensorRole::kExpertGate, TensorRole::kExpertUp}, TensorRole::kExpertDown, l, e);
      }
      keep_if_output_kept({TensorRole::kSharedGate, TensorRole::kSharedUp}, TensorRole::kSharedDown, l, -1);
    } else {
      keep_if_output_kept({TensorRole::kGate, TensorRole::kUp, TensorRole::kGateUp}, TensorRole::kDown, l, -1);
    }
  }
}

}  // namespace

StatusOr<TpPlan> plan_for_config(const TesseraConfig& config, const Checkpoint& checkpoint,
                                 const ModelConfig& model_config, bool use_env) {
  AutoTpOptions options = auto_tp_options_from(config, use_env);
  TESSERA_ASSIGN_OR_RETURN(TpPlan plan, plan_tensor_parallel(model_config, checkpoint.tensor_names(), options,
                                                             config.parallel.tensor_parallel));
  keep_inputs_of_kept_groups(model_config, plan);
  return plan;
}

Status merge_deepspeed_env(TesseraConfig& config) {
  AutoTpOptions merged = auto_tp_options_from(config, /*use_env=*/true);
  TESSERA_RETURN_IF_ERROR(merged.status);
  config.parallel.auto_tp.all_reduce_linear = merged.all_reduce_linear;
  config.parallel.auto_tp.keep_linear = merged.keep_linear;
  return Status::ok();
}

StatusOr<ModelConfig> check_deployment(const TesseraConfig& config) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(config.model.path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_source()));
  TESSERA_RETURN_IF_ERROR(plan_for_config(config, *ckpt, mc, /*use_env=*/false).status());
  TESSERA_RETURN_IF_ERROR(ShardSpec::make(mc, 0, config.parallel.tensor_parallel).status());
  if (config.speculative.method == SpeculativeConfig::Method::kDraft)
    TESSERA_RETURN_IF_ERROR(
        check_draft_model(config.speculative.draft_model, mc, configured_max_model_len(config, mc)).status());
  return mc;
}

int64_t configured_max_model_len(const TesseraConfig& config, const ModelConfig& model) {
  return config.scheduler.max_model_len.value_or(model.max_positions > 0 ? model.max_positions : int64_t{4096});
}

StatusOr<std::string> describe_tp_plan(const TesseraConfig& config) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(config.model.path));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_source()));
  TESSERA_ASSIGN_OR_RETURN(TpPlan plan, plan_for_config(config, *ckpt, mc, /*use_env=*/true));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& name : ckpt->tensor_names()) shapes[name] = ckpt->find(name)->shape;
  TESSERA_RETURN_IF_ERROR(check_tp_plan_shapes(plan, mc, shapes));
  return format_tp_plan(plan, mc, shapes);
}

Status run_worker(const TesseraConfig& local_config, int rank) {
  WorkerLinkOptions lo;
  lo.coordinator_address = local_config.worker.control_address.empty() ? local_config.server.control
                                                                       : local_config.worker.control_address;
  TESSERA_ASSIGN_OR_RETURN(CurveClientKeys curve, load_curve_client_keys(local_config.server.curve));
  lo.curve_server_public_key = curve.server_public_key;
  lo.curve_public_key = curve.client.public_key;
  lo.curve_secret_key = curve.client.secret_key;
  if (!curve.server_public_key.empty()) {
    TESSERA_LOG_INFO("rank {}: CURVE on; this worker's public key is {}", rank, curve.client.public_key);
  }
  lo.rank = rank;
  lo.world_size = local_config.parallel.tensor_parallel;
  // The backend is made before registering, from this worker's own configuration, so the
  // registration reports its device's memory (cache.num_blocks auto sizes the KV pool from
  // it; a coordinator whose worker.backend names another backend refuses the rank). CPU
  // ranks take their share of the cores first: the CPU backend pins its threads when made.
  const std::optional<BackendKind> choice = local_config.worker.backend;
  int threads = local_config.worker.threads;
  if (choice.value_or(auto_backend_kind()) == BackendKind::kCpu) {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const CpuShare share = take_cpu_share(rank, lo.world_size, threads, omp != nullptr && *omp != '\0');
    threads = share.threads;
    TESSERA_LOG_INFO("rank {}: {} CPU thread(s): {}", rank, threads > 0 ? std::to_string(threads) : std::string(omp ? omp : "?"),
                     share.reason);
    if (share.oversubscribed) {
      TESSERA_LOG_WARN("rank {}: worker.threads {} is more than the cores this rank has ({}): its threads will "
                       "share cores and wait on each other at every step (0 = one per core)",
                       rank, threads, share.reason);
    }
  }
  // Kernel choices: worker.cpu, then the TESSERA_CPU_* variables of this process over it.
  TESSERA_ASSIGN_OR_RETURN(const KernelOptions kernels, kernel_options_from_environment(local_config.worker.cpu));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(choice, BackendOptions{threads, rank, kernels}));
  TESSERA_ASSIGN_OR_RETURN(MemoryInfo memory, backend->memory_info());
  int64_t offered = memory.free_bytes;
  const int64_t limit = local_config.worker.memory_limit_bytes;
  if (limit > 0 && limit < offered) offered = limit;
  lo.backend = backend->name();
  lo.free_memory_bytes = static_cast<uint64_t>(std::max<int64_t>(offered, 0));
  lo.total_memory_bytes = static_cast<uint64_t>(std::max<int64_t>(memory.total_bytes, 0));
  TESSERA_LOG_INFO("rank {}: backend {}, {} MB free of {} MB{}", rank, backend->name(), memory.free_bytes / 1000000,
                   memory.total_bytes / 1000000,
                   offered < memory.free_bytes
                       ? "; offering " + std::to_string(offered / 1000000) + " MB (worker.memory_limit_bytes)"
                       : std::string());
  lo.heartbeat_interval = std::chrono::milliseconds(local_config.server.heartbeat_ms);
  lo.coordinator_dead_after_intervals = local_config.server.heartbeat_misses;
  // An unreachable coordinator is an error after ten "dead" periods (30 s by default).
  lo.register_timeout = std::chrono::milliseconds(
      std::max(2000, 10 * local_config.server.heartbeat_ms * local_config.server.heartbeat_misses));
  WorkerLink link(lo);

  // Built by setup, used by every step.
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Transformer> draft;  // speculative.method draft
  std::unique_ptr<Executor> executor;

  auto setup = [&](const wire::Assignment& a) -> Status {
    // The coordinator's configuration is authoritative: every rank plans from the same one.
    TESSERA_ASSIGN_OR_RETURN(TesseraConfig config,
                             parse_config_yaml(a.worker_config_yaml, "the coordinator's configuration"));
    const auto dtype = parse_float_dtype(a.dtype);
    const auto kv_dtype = parse_float_dtype(a.kv_dtype.empty() ? a.dtype : a.kv_dtype);
    if (!dtype || !kv_dtype) return invalid_argument("assignment: bad dtype \"" + a.dtype + "\"");
    // The collective (worker/collective_group.h): the coordinator's choice for the group, this
    // worker's address for Gloo. GPU ranks take one device each (rank r of this host device r
    // modulo the visible count).
    CollectiveGroupOptions co;
    co.kind = config.worker.collectives;
    co.rank = a.rank;
    co.world_size = a.world_size;
    co.gpu = backend->kind() != BackendKind::kCpu;
    co.shm_group = a.collective_bootstrap;
    co.gloo_address = local_config.worker.collectives_address;
    co.gloo_interface = local_config.worker.collectives_interface;
    TESSERA_ASSIGN_OR_RETURN(comm, make_group_communicator(co, link));
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(a.model_path));
    TESSERA_ASSIGN_OR_RETURN(ModelConfig mc, parse_model_config(ckpt->config(), ckpt->config_source()));
    config.parallel.tensor_parallel = a.world_size;
    TESSERA_ASSIGN_OR_RETURN(TpPlan plan, plan_for_config(config, *ckpt, mc, /*use_env=*/false));
    ckpt.reset();
    ModelLoadOptions mo;
    mo.dtype = *dtype;
    mo.kernel_inject = a.kernel_inject;
    mo.comm = comm.get();
    mo.plan = &plan;
    mo.quant = quantization_options(config.model);
    mo.check_weights = config.model.check_weights;
    mo.lm_head = config.server.task != "embed";
    mo.max_context = config.scheduler.max_model_len.value_or(0);
    mo.residency.budget = config.model.weights_memory_budget;
    mo.residency.spill_dir = config.model.weights_spill_dir;
    mo.residency.cache_dir = config.model.weights_cache_dir;
    mo.residency.prefetch_layers = config.model.weights_prefetch_layers;
    mo.residency.streaming = config.model.weights_streaming;
    mo.huge_pages = config.model.weights_huge_pages;  // (auto loads onto huge pages: serve() chose before)
    mo.log_prefix = "rank " + std::to_string(a.rank) + "/" + std::to_string(a.world_size);
    TESSERA_ASSIGN_OR_RETURN(model, Transformer::load(a.model_path, mo, *backend));
    if (const std::string plan = model->streaming_plan(); !plan.empty())
      TESSERA_LOG_INFO("rank {}/{} {}", a.rank, a.world_size, plan);
    // The activation memory the KV pool was sized beside: the backend's recycled buffers stay
    // within it.
    const ModelWeights& loaded = model->weights();
    const bool attn_split = !loaded.layers.empty() && loaded.layers[0].attn_split;
    const bool mlp_split = !loaded.layers.empty() && loaded.layers[0].mlp_split;
    const StepActivations activations = planned_step_activations(
        config, ActivationWidths::of(model->config(), a.world_size, attn_split, mlp_split, loaded.vocab_split));
    backend->bound_activation_memory(activations.pooled);
    TESSERA_LOG_INFO("rank {}/{} activations: {} planned ({:.1f} MiB of it in recycled buffers, held within that)",
                     a.rank, a.world_size, activations.describe(), static_cast<double>(activations.pooled) / (1 << 20));
    if (config.speculative.method == SpeculativeConfig::Method::kDraft) {
      TESSERA_ASSIGN_OR_RETURN(draft, load_draft_model(config.speculative.draft_model, mo, *backend));
      TESSERA_LOG_INFO("rank {}/{} loaded the draft {} ({} MB of weights, {})", a.rank, a.world_size,
                       config.speculative.draft_model, draft->weights().total_bytes / 1000000,
                       draft->shard().world > 1 ? "split like the target" : "whole on every rank");
    }
    executor = std::make_unique<Executor>(*model, *backend, a.kv_block_size, a.kv_num_blocks, *kv_dtype, draft.get(),
                                          config.speculative.draft_min_probability);
    executor->set_max_loras(config.lora.max_loras);
    executor->set_lora_loader([&model, model_path = a.model_path, max_rank = config.lora.max_rank](
                                  const std::string& name, const std::string& dir) -> StatusOr<LoraWeights> {
      TESSERA_ASSIGN_OR_RETURN(LoraWeights adapter,
                               load_lora_weights(name, dir, model_path, model->weights(), model->dtype(), max_rank));
      TESSERA_LOG_INFO("loaded LoRA adapter {} from {} at run time (rank {}, {} KB here)", name, dir, adapter.rank,
                       adapter.bytes / 1000);
      return adapter;
    });
    for (const auto& [name, dir] : config.lora.adapters) {
      TESSERA_ASSIGN_OR_RETURN(LoraWeights adapter, load_lora_weights(name, dir, a.model_path, model->weights(),
                                                                      model->dtype(), config.lora.max_rank));
      TESSERA_LOG_INFO("rank {}/{} loaded LoRA adapter {} from {} (rank {}, {} KB here)", a.rank, a.world_size, name, dir,
                       adapter.rank, adapter.bytes / 1000);
      executor->add_lora(std::move(adapter));
    }
    TESSERA_LOG_INFO("rank {}/{} loaded {} ({} MB of weights, {} KV blocks{})", a.rank, a.world_size, a.model_path,
                     model->weights().total_bytes / 1000000, a.kv_num_blocks,
                     mo.lm_head ? "" : "; no LM head: server.task is embed");
    return Status::ok();
  };
  // A failed collective breaks the group for good: the link reports the step's failure and
  // ends the session; we return its error so that the supervisor (tessera-serve, or whoever
  // started us) restarts this rank.
  Status fatal;
  auto step = [&](const StepPlan& plan) -> StatusOr<StepResult> {
    if (!executor) return internal_error("step before the model was loaded");
    StatusOr<StepResult> result = executor->execute(plan);
    if (!result.is_ok() && result.status().code() == StatusCode::kUnavailable) fatal = result.status();
    return result;
  };
  Status st = link.run(setup, step);
  return fatal.is_ok() ? st : fatal;
}

}  // namespace tessera
