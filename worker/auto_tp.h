#pragma once
// The auto-TP planner: decides, for every weight of a checkpoint, whether it is split by
// output features (column), by input features (row, all-reduced), by vocabulary rows, or
// kept whole on every rank. Sources, lowest to highest precedence:
//   1. the built-in policy of the architecture (ArchSpec TensorRole -> role);
//   2. all_reduce_linear (-> row), then keep_linear (-> keep): YAML parallel.auto_tp merged
//      with DeepSpeed's DS_ALL_REDUCE_LINEAR_ITEMS / DS_KEEP_LINEAR_ITEMS (the environment wins
//      for the same name); names are suffix-matched against the module path at a '.'
//      boundary and apply only when their model_type matches config.json's;
//   3. injection_policy ({BloomBlock: [self_attention.dense, mlp.dense_4h_to_h]}): within
//      that block, the listed linears are row and its other linears column;
//   4. rules: ordered regexes, the first that matches the tensor name wins.
// docs/configuration.md describes the keys, docs/models.md each family's plan.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/model_config.h"
#include "worker/tp_plan.h"

namespace tessera {

struct AutoTpOptions {
  std::map<std::string, std::string> all_reduce_linear;  // linear name suffix -> model_type
  std::map<std::string, std::string> keep_linear;        // linear name suffix -> model_type
  std::map<std::string, std::vector<std::string>> injection_policy;  // block -> row linears
  std::vector<TpRuleConfig> rules;                        // first match wins
  // Not ok when an environment variable was malformed; plan_tensor_parallel returns it.
  Status status;
};

// Parses DeepSpeed's Python-dict-like value: "{'w2':'mixtral', \"gate\": \"mixtral\"}".
// Keys and values are single- or double-quoted strings; spaces and a trailing comma are
// allowed; an empty value or "{}" is an empty map. Entries are added to *out (a later
// duplicate wins). Errors name `var_name` and the offending position.
Status parse_ds_env_items(const char* var_name, const char* value, std::map<std::string, std::string>* out);

// The YAML's parallel.auto_tp / injection_policy, with DS_ALL_REDUCE_LINEAR_ITEMS and
// DS_KEEP_LINEAR_ITEMS merged over them when use_env (environment entries win).
AutoTpOptions auto_tp_options_from(const TesseraConfig& config, bool use_env = true);

// Roles for every name in tensor_names (biases follow their weight). Errors name the
// tensor, its layer and the sizes that do not divide by world_size.
StatusOr<TpPlan> plan_tensor_parallel(const ModelConfig& config, const std::vector<std::string>& tensor_names,
                                      const AutoTpOptions& options, int world_size);

// Re-checks a plan against the checkpoint's real shapes (tensors the architecture table
// does not know are only checked here). Call before slice_for.
Status check_tp_plan_shapes(const TpPlan& plan, const ModelConfig& config,
                            const std::map<std::string, std::vector<int64_t>>& full_shapes);

// The part of a tensor one rank loads: `count` entries starting at `begin` along `axis`,
// or the whole tensor when axis < 0.
struct TpSlice {
  int axis = -1;
  int64_t begin = 0;
  int64_t count = 0;
  bool whole() const { return axis < 0; }
  bool operator==(const TpSlice&) const = default;
};

// Rank `rank`'s slice of `tensor` (full_shape as in the checkpoint). Column: rows (axis 0)
// by head / feature / vocab ranges; row: columns (axis 1); a row weight's bias, keep and
// unlisted tensors: whole. K/V with world > kv_heads: rank r loads kv head
// r / (world / kv_heads) whole (replicated). Aborts on a split the plan should have rejected.
TpSlice slice_for(const TpPlan& plan, const ModelConfig& config, const std::string& tensor,
                  const std::vector<int64_t>& full_shape, int rank);

// A table for `tessera-worker --print-tp-plan`: tensor, role, full shape, per-rank shape
// (and which kv head a rank holds when kv heads are replicated).
std::string format_tp_plan(const TpPlan& plan, const ModelConfig& config,
                           const std::map<std::string, std::vector<int64_t>>& full_shapes);

}  // namespace tessera
