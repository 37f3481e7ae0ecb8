#pragma once
// The coordinator's side of a deployment: a WorkerGroup whose assignments carry the model,
// the KV pool and the configuration itself (so every rank plans the same way).
#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "coordinator/worker_group.h"

namespace tessera {

struct ClusterOptions {
  TesseraConfig config;     // DeepSpeed environment variables already merged in
  int kv_num_blocks = 0;    // the same pool size on every rank (the scheduler's)
  DType kv_dtype = DType::kF32;
  std::string group_name;   // names the collective group (shared-memory segment) of this run
};

StatusOr<std::unique_ptr<WorkerGroup>> start_cluster(const ClusterOptions& options);

}  // namespace tessera
