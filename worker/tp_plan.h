#pragma once
// How each weight of a model is split across tensor-parallel ranks. Built by the auto-TP
// planner (worker/auto_tp.h) from the architecture's built-in policy, YAML overrides and
// DeepSpeed's environment variables; consumed by the weight loader, which reads only each
// rank's slice.
#include <map>
#include <string>
#include <vector>

namespace tessera {

enum class TpRole {
  kColumn,      // output features split (rows of an [out, in] weight); no communication
  kRow,         // input features split (columns); partial sums all-reduced after the matmul
  kKeep,        // replicated whole on every rank (norms, MoE router, small linears)
  kVocab,       // vocabulary rows split: embedding (all-reduce) and LM head (all-gather)
};
const char* tp_role_name(TpRole role);  // "column", "row", "keep", "vocab"

struct TpPlan {
  int world_size = 1;
  // Role of every weight tensor by its checkpoint name (biases follow their weight: a
  // column weight's bias is split with it, a row weight's bias is added once, after the
  // all-reduce).
  std::map<std::string, TpRole> roles;

  TpRole role_of(const std::string& tensor_name) const;  // kKeep when not listed
};

}  // namespace tessera
