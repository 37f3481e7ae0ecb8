#pragma once
// The coordinator's side of a deployment: a WorkerGroup whose assignments carry the model,
// the KV pool and the configuration itself (so every rank plans the same way).
//
// The KV pool: cache.num_blocks when the configuration fixes it; with "auto", the group
// holds every assignment until all ranks have registered and sizes the pool from what they
// reported (coordinator/cluster/kv_pool_sizing.h). A rank registering later (a restart) that
// reports too little memory for that pool is refused with the reason.
#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "coordinator/cluster/kv_pool_sizing.h"
#include "coordinator/cluster/worker_group.h"

namespace tessera {

struct ClusterOptions {
  TesseraConfig config;     // DeepSpeed environment variables already merged in
  DType kv_dtype = DType::kF32;
  std::string group_name;   // names the collective group (shared-memory segment) of this run
  // cache.num_blocks "auto" only: the model's side of the sizing (per-rank bytes per block
  // and weights, max_model_len, max_num_seqs).
  KvPoolModel kv_model;
};

struct Cluster {
  std::unique_ptr<WorkerGroup> group;
  // The pool every rank got; set before the first assignment is sent, so present once
  // group->wait_until_ready() has succeeded.
  std::shared_ptr<KvPoolSetting> kv_pool;
};

StatusOr<Cluster> start_cluster(const ClusterOptions& options);

// What the workers receive as Assignment.worker_config_yaml: `config` with its secrets
// (server.http.api_keys, and the path of server.http.api_keys_file) removed; a worker never
// needs them.
std::string worker_config_yaml(const TesseraConfig& config);

}  // namespace tessera
