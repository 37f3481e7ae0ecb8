#include "worker/tp_plan.h"

namespace tessera {

TpRole TpPlan::role_of(const std::string& tensor_name) const {
  auto it = roles.find(tensor_name);
  return it == roles.end() ? TpRole::kKeep : it->second;
}

KvHeadRange kv_heads_for_rank(int64_t heads, int64_t kv_heads, int rank, int world) {
  const int64_t q_local = heads / world, group = heads / kv_heads;
  const int64_t first_q = rank * q_local, last_q = first_q + q_local - 1;
  return {first_q / group, last_q / group - first_q / group + 1};
}

}  // namespace tessera
