#pragma once
// The units a rank's weights are streamed in beyond model.weights_memory_budget, and which of
// them stay resident, by one rule for every way of streaming (the CPU's spill file,
// worker/weight_residency.h; a device's slots, worker/staged_weights.h).
//
// Units, in a step's order: the embedding table (when not tied to the LM head), each layer,
// the LM head (a tied head is the table). What stays resident: the norms and biases outside
// the layers always; then the LM head (read whole every step), then layers from the first,
// then the embedding table (a row per token), while they fit in the budget.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/weights_budget.h"
#include "worker/model_weights.h"

namespace tessera {

// The tensors of one unit; each distinct buffer counts once (a tied head and table, views
// that share a buffer).
using UnitTensors = std::vector<Tensor*>;
int64_t distinct_bytes(const UnitTensors& tensors);
// A layer's tensors in for_each_layer_tensor's order (empty ones included), and the name its
// unit goes by ("layer 3"; a cache file's records are keyed by it too).
UnitTensors layer_tensors(LayerWeights& layer);
std::string layer_unit_name(int layer);

struct WeightUnit {
  std::string name;
  UnitTensors tensors;
  int64_t bytes = 0;  // its distinct buffers
  bool streamed = false;
};

struct WeightUnits {
  std::vector<WeightUnit> units;  // a step's order
  int table = -1;                 // the unit the embedding lookup reads (the head's when tied)
  int head = -1;
  int first_layer = 0;
  bool tied = false;
  int64_t fixed_bytes = 0;   // the norms and biases outside the layers: always resident
  bool fixed_positions = false;  // fixed_bytes includes a learned position table (GPT-2)
  int64_t all_bytes = 0;     // every weight of the rank
  int64_t budget_bytes = 0;  // set by decide_streamed_units
  int layer_unit(int layer) const { return first_layer + layer; }
  // The layer a unit is, or -1 for the table and the head.
  int layer_of(int unit) const {
    return unit >= first_layer && unit != head && unit != table ? unit - first_layer : -1;
  }
  bool any_streamed() const;
  int64_t resident_bytes() const;  // the fixed tensors and the units not streamed
  int64_t streamed_bytes() const;  // the units streamed
};

WeightUnits weight_units(ModelWeights& weights);

// Marks the units streamed under `budget` (a share is of all_bytes), or, where `budget_bytes`
// is given (>= 0), under that many bytes. `layer_streamed` (may be empty): layers already
// decided while loading, kept as they are. A budget below the fixed tensors, or a byte count
// (not a share) below the largest layer, is refused naming the key.
Status decide_streamed_units(WeightUnits& units, const WeightsBudget& budget, int64_t budget_bytes = -1,
                             const std::vector<bool>& layer_streamed = {});

// model.weights_prefetch_layers: at least 1 (the unit running).
Status check_prefetch_layers(int prefetch_layers);

// For the start-up plans: what stays ("norms, LM head, 3 layers") and what streams
// ("embedding table, 9 layers").
struct UnitLists {
  std::string resident, streamed;
};
UnitLists unit_lists(const WeightUnits& units);

// "1.5 MiB", "12 KiB": the plans' unit of account.
std::string weight_mib(int64_t bytes);

}  // namespace tessera
