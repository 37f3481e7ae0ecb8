#include "worker/staged_weights.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "common/check.h"

namespace tessera {
namespace {

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// Where each distinct buffer of a unit lies within it (64-byte aligned, in the unit's order;
// tensors sharing a buffer share its place); returns the unit's span.
size_t lay_out(const UnitTensors& tensors, std::vector<size_t>* offsets) {
  std::unordered_map<const void*, size_t> at;
  size_t end = 0;
  offsets->clear();
  for (Tensor* t : tensors) {
    if (t->empty()) {
      offsets->push_back(0);
      continue;
    }
    auto [it, fresh] = at.emplace(t->view().data, end);
    if (fresh) end = align64(end + t->nbytes());
    offsets->push_back(it->second);
  }
  return end;
}

}  // namespace

Status check_device_streaming_options(const WeightResidencyOptions& o) {
  if (!o.spill_dir.empty()) {
    return invalid_argument("model.weights_spill_dir '" + o.spill_dir +
                            "': a device streams its weights from pinned host memory, not from a spill file "
                            "(leave the key empty)");
  }
  if (!o.cache_dir.empty()) {
    return invalid_argument("model.weights_cache_dir '" + o.cache_dir +
                            "': a device streams its weights from pinned host memory, not from a cache file "
                            "(leave the key empty)");
  }
  if (o.streaming != WeightStreaming::kRead) {
    return invalid_argument(std::string("model.weights_streaming ") + weight_streaming_name(o.streaming) +
                            ": a device copies its streamed weights from pinned host memory; map and direct are "
                            "ways of reading the CPU's spill file (leave the key at read)");
  }
  return Status::ok();
}

StatusOr<std::unique_ptr<StagedWeights>> StagedWeights::make(ModelWeights& w, const WeightResidencyOptions& options,
                                                             Backend& backend) {
  if (options.budget.all()) return std::unique_ptr<StagedWeights>();
  TESSERA_RETURN_IF_ERROR(check_prefetch_layers(options.prefetch_layers));
  WeightUnits units = weight_units(w);
  TESSERA_RETURN_IF_ERROR(decide_streamed_units(units, options.budget));
  if (!units.any_streamed()) return std::unique_ptr<StagedWeights>();
  std::unique_ptr<StagedWeights> s(new StagedWeights());
  s->prefetch_ = options.prefetch_layers;
  s->device_ = backend.device();
  const size_t n = units.units.size();
  s->host_offset_.assign(n, 0);
  s->tensor_offset_.resize(n);
  s->unit_bytes_.assign(n, 0);
  s->unit_slot_.assign(n, -1);
  size_t host_bytes = 0;
  int streamed = 0;
  for (size_t u = 0; u < n; ++u) {
    const WeightUnit& unit = units.units[u];
    if (!unit.streamed) continue;
    ++streamed;
    s->unit_bytes_[u] = lay_out(unit.tensors, &s->tensor_offset_[u]);
    s->host_offset_[u] = host_bytes;
    host_bytes += s->unit_bytes_[u];
    s->slot_bytes_ = std::max(s->slot_bytes_, s->unit_bytes_[u]);
  }
  // More slots than streamed units would never be used.
  const int slots = std::min(s->prefetch_, streamed);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<WeightStager> stager,
                           backend.make_weight_stager(host_bytes, s->slot_bytes_, slots));
  s->stager_ = std::move(stager);
  s->slot_unit_.assign(static_cast<size_t>(slots), -1);
  s->slot_busy_.assign(static_cast<size_t>(slots), false);
  s->slot_freed_.assign(static_cast<size_t>(slots), 0);
  // The streamed units into host memory; their tensors then point at their host copies (which
  // place_model_weights leaves alone) until a step points them at their unit's slot.
  for (size_t u = 0; u < n; ++u) {
    const WeightUnit& unit = units.units[u];
    if (!unit.streamed) continue;
    char* host = s->stager_->host() + s->host_offset_[u];
    std::unordered_set<const void*> copied;  // a buffer two tensors share, once
    for (size_t i = 0; i < unit.tensors.size(); ++i) {
      const Tensor* t = unit.tensors[i];
      if (!t->empty() && copied.insert(t->view().data).second)
        std::memcpy(host + s->tensor_offset_[u][i], t->view().data, t->nbytes());
    }
  }
  s->units_ = std::move(units);
  s->host_bytes_ = host_bytes;
  for (size_t u = 0; u < n; ++u)
    if (s->units_.units[u].streamed) s->point(static_cast<int>(u), -1);
  return s;
}

void StagedWeights::bind(ModelWeights& w) {
  WeightUnits fresh = weight_units(w);  // the tensors point at their host copies: ties as before
  TESSERA_CHECK_EQ(fresh.units.size(), units_.units.size()) << "staged weights bound to another model";
  for (size_t u = 0; u < fresh.units.size(); ++u) units_.units[u].tensors = fresh.units[u].tensors;
}

bool StagedWeights::in_host_memory(const Tensor& t) const {
  const char* p = static_cast<const char*>(t.view().data);
  return p != nullptr && p >= stager_->host() && p < stager_->host() + host_bytes_;
}

void StagedWeights::point(int unit, int slot) {
  const auto u = static_cast<size_t>(unit);
  char* base = slot >= 0 ? stager_->slot(slot) : stager_->host() + host_offset_[u];
  std::shared_ptr<const void> owner(stager_, base);
  const UnitTensors& tensors = units_.units[u].tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor* t = tensors[i];
    if (t->empty()) continue;
    TensorView v = t->view();
    v.data = base + tensor_offset_[u][i];
    v.device = slot >= 0 ? device_ : DeviceKind::kCpu;
    *t = Tensor::borrowed(v, owner);
  }
}

std::vector<int> StagedWeights::window(int unit) const {
  std::vector<int> w = {unit};
  const int n = static_cast<int>(units_.units.size());
  for (int v = (unit + 1) % n; v != unit && static_cast<int>(w.size()) < prefetch_; v = (v + 1) % n)
    if (units_.units[static_cast<size_t>(v)].streamed) w.push_back(v);
  return w;
}

void StagedWeights::fetch(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (unit_slot_[u] >= 0) return;  // still in its slot
  // A slot outside the window, the least recently done with (there is one: the window holds
  // at most as many units as there are slots).
  int slot = -1;
  for (size_t i = 0; i < slot_unit_.size(); ++i) {
    if (slot_busy_[i]) continue;
    if (slot < 0 || slot_freed_[i] < slot_freed_[static_cast<size_t>(slot)]) slot = static_cast<int>(i);
  }
  TESSERA_CHECK(slot >= 0) << "staged weights: every slot is busy";
  const auto si = static_cast<size_t>(slot);
  if (slot_unit_[si] >= 0) unit_slot_[static_cast<size_t>(slot_unit_[si])] = -1;
  slot_unit_[si] = unit;
  slot_busy_[si] = true;
  unit_slot_[u] = slot;
  stager_->copy_in(slot, stager_->host() + host_offset_[u], unit_bytes_[u]);
  ++copies_;
}

void StagedWeights::use(int unit) {
  if (unit < 0 || !units_.units[static_cast<size_t>(unit)].streamed) return;
  // The unit and the streamed units after it (this step's, then the next's) are held or
  // copied in; nothing else is running (the unit before was done with), so every other slot
  // may be overwritten. Decided afresh each time, so a step that skips a unit (no LM head)
  // leaves nothing held.
  const std::vector<int> w = window(unit);
  std::fill(slot_busy_.begin(), slot_busy_.end(), false);
  for (int v : w)
    if (const int slot = unit_slot_[static_cast<size_t>(v)]; slot >= 0) slot_busy_[static_cast<size_t>(slot)] = true;
  for (int v : w) fetch(v);
  const int slot = unit_slot_[static_cast<size_t>(unit)];
  stager_->wait(slot);
  point(unit, slot);
}

void StagedWeights::done(int unit) {
  if (unit < 0 || !units_.units[static_cast<size_t>(unit)].streamed) return;
  const auto slot = static_cast<size_t>(unit_slot_[static_cast<size_t>(unit)]);
  stager_->release(static_cast<int>(slot));
  slot_freed_[slot] = ++clock_;
}

void StagedWeights::before_embedding() { use(units_.table); }
void StagedWeights::after_embedding() { done(units_.table); }
void StagedWeights::before_layer(int layer) { use(units_.layer_unit(layer)); }
void StagedWeights::after_layer(int layer) { done(units_.layer_unit(layer)); }
void StagedWeights::before_lm_head() { use(units_.head); }
void StagedWeights::after_lm_head() { done(units_.head); }

std::string StagedWeights::plan() const {
  const UnitLists lists = unit_lists(units_);
  return "weights: budget " + weight_mib(units_.budget_bytes) + "; resident " + weight_mib(units_.resident_bytes()) +
         " (" + lists.resident + "); streamed " + weight_mib(units_.streamed_bytes()) + " per step (" + lists.streamed +
         ") from host memory into " + std::to_string(slot_unit_.size()) +
         (slot_unit_.size() == 1 ? " device buffer of " : " device buffers of ") +
         weight_mib(static_cast<int64_t>(slot_bytes_)) + " (model.weights_prefetch_layers)";
}

}  // namespace tessera
