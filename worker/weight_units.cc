#include "worker/weight_units.h"

#include <algorithm>
#include <unordered_map>

namespace tessera {

int64_t distinct_bytes(const UnitTensors& ts) {
  std::unordered_map<const void*, size_t> seen;
  int64_t total = 0;
  for (Tensor* t : ts)
    if (!t->empty() && seen.emplace(t->view().data, t->nbytes()).second) total += static_cast<int64_t>(t->nbytes());
  return total;
}

UnitTensors layer_tensors(LayerWeights& layer) {
  UnitTensors ts;
  for_each_layer_tensor(layer, [&](Tensor& t) { ts.push_back(&t); });
  return ts;
}

std::string layer_unit_name(int layer) { return "layer " + std::to_string(layer); }

bool WeightUnits::any_streamed() const {
  return std::any_of(units.begin(), units.end(), [](const WeightUnit& u) { return u.streamed; });
}

int64_t WeightUnits::resident_bytes() const {
  int64_t n = fixed_bytes;
  for (const WeightUnit& u : units)
    if (!u.streamed) n += u.bytes;
  return n;
}

Status check_prefetch_layers(int prefetch_layers) {
  if (prefetch_layers >= 1) return Status::ok();
  return invalid_argument("model.weights_prefetch_layers: at least 1 (the layer running), got " +
                          std::to_string(prefetch_layers));
}

int64_t WeightUnits::streamed_bytes() const { return all_bytes - resident_bytes(); }

std::string weight_mib(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return std::to_string((bytes + 1023) >> 10) + " KiB";
  const int64_t tenths = (bytes * 10 + (1 << 19)) >> 20;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

UnitLists unit_lists(const WeightUnits& u) {
  UnitLists out{"norms", ""};
  int resident_layers = 0, streamed_layers = 0;
  for (size_t i = 0; i < u.units.size(); ++i) {
    const WeightUnit& unit = u.units[i];
    if (u.layer_of(static_cast<int>(i)) >= 0) {
      ++(unit.streamed ? streamed_layers : resident_layers);
    } else {
      std::string& list = unit.streamed ? out.streamed : out.resident;
      list += (list.empty() ? "" : ", ") + unit.name;
    }
  }
  auto layers_text = [](int n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); };
  if (resident_layers > 0) out.resident += ", " + layers_text(resident_layers);
  if (streamed_layers > 0) out.streamed += (out.streamed.empty() ? "" : ", ") + layers_text(streamed_layers);
  return out;
}

WeightUnits weight_units(ModelWeights& w) {
  WeightUnits u;
  u.tied = !w.embed.empty() && w.lm_head.w.view().data == w.embed.view().data;
  if (!u.tied && !w.embed.empty()) {
    u.table = 0;
    u.units.push_back({"embedding table", {&w.embed}});
  }
  u.first_layer = static_cast<int>(u.units.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    u.units.push_back({layer_unit_name(static_cast<int>(l)), layer_tensors(w.layers[l])});
  }
  if (u.tied || !w.lm_head.w.empty()) {
    u.head = static_cast<int>(u.units.size());
    u.units.push_back({u.tied ? "LM head (the embedding table)" : "LM head", {&w.lm_head.w, &w.lm_head.scales}});
    if (u.tied) {
      // (A coded table's side tensor is the head's scales: one buffer, as the table is the head's.)
      u.units.back().tensors.push_back(&w.embed);
      u.units.back().tensors.push_back(&w.embed_side);
      u.table = u.head;
    }
  }
  for (WeightUnit& unit : u.units) u.all_bytes += unit.bytes = distinct_bytes(unit.tensors);
  for (const Tensor* t :
       {&w.pos_embed, &w.embed_norm_w, &w.embed_norm_b, &w.final_norm_w, &w.final_norm_b, &w.lm_head.b})
    if (!t->empty()) u.fixed_bytes += static_cast<int64_t>(t->nbytes());
  u.fixed_positions = !w.pos_embed.empty();
  u.all_bytes += u.fixed_bytes;
  return u;
}

Status decide_streamed_units(WeightUnits& u, const WeightsBudget& budget, int64_t budget_bytes,
                             const std::vector<bool>& layer_streamed) {
  u.budget_bytes = budget_bytes >= 0 ? budget_bytes : budget.bytes_for(u.all_bytes);
  if (layer_streamed.empty() && u.budget_bytes >= u.all_bytes) return Status::ok();  // everything fits
  if (u.budget_bytes < u.fixed_bytes) {
    return invalid_argument("model.weights_memory_budget " + budget.to_string() + " (" + weight_mib(u.budget_bytes) +
                            " of this rank's " + weight_mib(u.all_bytes) +
                            " of weights) is below the " +
                            (u.fixed_positions ? "norms, biases and position table" : "norms and biases") +
                            " every step reads, which stay resident (" +
                            weight_mib(u.fixed_bytes) + ")");
  }
  // A byte count below one layer is taken for a slip of unit (500KB for 500MB): each layer
  // is held whole while it runs, on top of the budget, so such a budget keeps no layer and
  // says nothing about memory. Streaming every layer on purpose is a share (5%), which stays
  // meaningful at any model size.
  int64_t largest_layer = 0;
  for (int i = 0; i < static_cast<int>(u.units.size()); ++i)
    if (u.layer_of(i) >= 0) largest_layer = std::max(largest_layer, u.units[static_cast<size_t>(i)].bytes);
  if (budget.bytes >= 0 && u.budget_bytes < largest_layer) {
    return invalid_argument("model.weights_memory_budget " + budget.to_string() + " (" + weight_mib(u.budget_bytes) +
                            ") is below this rank's largest layer (" + weight_mib(largest_layer) +
                            "), which is held whole while it runs on top of the budget; give at least that, or a "
                            "share such as 5% to stream every layer");
  }
  // Resident by the rule: the head, the layers from the first, the table; the rest streams.
  std::vector<int> order;
  if (u.head >= 0) order.push_back(u.head);
  for (int l = 0; l < static_cast<int>(u.units.size()); ++l)
    if (u.layer_of(l) >= 0) order.push_back(l);
  if (!u.tied && u.table >= 0) order.push_back(u.table);
  int64_t room = u.budget_bytes - u.fixed_bytes;
  bool full = false;
  for (int i : order) {
    WeightUnit& unit = u.units[static_cast<size_t>(i)];
    const int layer = u.layer_of(i);
    if (!layer_streamed.empty() && layer >= 0) {
      unit.streamed = layer_streamed[static_cast<size_t>(layer)];
      full = full || unit.streamed;
    } else {
      full = full || unit.bytes > room;  // resident units are a prefix of the order
      unit.streamed = full;
    }
    if (!unit.streamed) room -= unit.bytes;
  }
  return Status::ok();
}

}  // namespace tessera
