#pragma once
// A worker process's life: register with the coordinator, receive its assignment (model,
// rank, KV pool, collective group, and the coordinator's configuration), load only its
// shard, then execute every StepPlan in lock-step with the other ranks until shut down.
#include <string>

#include "common/checkpoint.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/model_config.h"
#include "worker/tp_plan.h"

namespace tessera {

// The TP plan a configuration gives for its model (auto-TP built-ins, YAML overrides and,
// with use_env, DeepSpeed's DS_* environment variables).
StatusOr<TpPlan> plan_for_config(const TesseraConfig& config, const Checkpoint& checkpoint,
                                 const ModelConfig& model_config, bool use_env);

// Folds DeepSpeed's DS_ALL_REDUCE_LINEAR_ITEMS / DS_KEEP_LINEAR_ITEMS (from this process's
// environment) into the config's auto_tp maps, so the configuration the coordinator hands to
// its workers carries them (workers then plan without reading their own environment).
Status merge_deepspeed_env(TesseraConfig& config);

// Everything a deployment can be refused for before any worker starts: the checkpoint and
// its config.json, the TP plan, whether the model divides across the ranks, and a draft
// model (speculative.draft_model) that cannot serve it. Returns the model's config.
StatusOr<ModelConfig> check_deployment(const TesseraConfig& config);

// The longest sequence served: scheduler.max_model_len, else the model's context (4096 when
// it states none).
int64_t configured_max_model_len(const TesseraConfig& config, const ModelConfig& model);

// The table `tessera-worker --print-tp-plan` prints.
StatusOr<std::string> describe_tp_plan(const TesseraConfig& config);

// Runs until the coordinator says shutdown (OK) or the session fails (the error).
Status run_worker(const TesseraConfig& config, int rank);

}  // namespace tessera
