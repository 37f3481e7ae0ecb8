#pragma once
// How each weight of a model is split across tensor-parallel ranks. Built by the auto-TP
// planner (worker/auto_tp.h) from the architecture's built-in policy, YAML overrides and
// DeepSpeed's environment variables; consumed by the weight loader, which reads only each
// rank's slice.
#include <map>
#include <string>
#include <vector>

#include "common/parallel_roles.h"

namespace tessera {


struct TpPlan {
  int world_size = 1;
  // Role of every weight tensor by its checkpoint name (biases follow their weight: a
  // column weight's bias is split with it, a row weight's bias is added once, after the
  // all-reduce).
  std::map<std::string, TpRole> roles;

  TpRole role_of(const std::string& tensor_name) const;  // kKeep when not listed
};

// The KV heads a rank keeps when query heads are split evenly (heads % world == 0): the
// contiguous range its query heads read under grouped-query attention. They divide evenly
// when kv_heads % world == 0; otherwise neighbouring ranks keep replicas of shared heads
// (e.g. 6 query / 3 KV heads on 2 ranks: rank 0 keeps KV heads 0-1, rank 1 keeps 1-2).
struct KvHeadRange {
  int64_t first = 0;
  int64_t count = 0;
};
KvHeadRange kv_heads_for_rank(int64_t heads, int64_t kv_heads, int rank, int world);

}  // namespace tessera
