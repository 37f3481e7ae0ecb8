#include "worker/lora_residency.h"

namespace tessera {

void LoraResidency::set_max_resident(int max_resident) {
  max_resident_ = max_resident;
  while (max_resident_ > 0 && resident_count() > max_resident_) evict(*least_recently_used({}));
}

void LoraResidency::add(LoraWeights adapter) {
  std::string name = adapter.name;
  Held& held = held_.insert_or_assign(std::move(name), Held{std::move(adapter), 0, false}).first->second;
  evict_lora(held.weights);
  if (max_resident_ == 0 || resident_count() < max_resident_) place_lora(held.weights, backend_);
}

bool LoraResidency::remove(const std::string& name) { return held_.erase(name) > 0; }

const LoraWeights* LoraResidency::find(const std::string& name) const {
  const auto h = held_.find(name);
  return h == held_.end() ? nullptr : &h->second.weights;
}

int LoraResidency::resident_count() const {
  int n = 0;
  for (const auto& [name, h] : held_) n += h.weights.resident ? 1 : 0;
  return n;
}

LoraResidency::Held* LoraResidency::least_recently_used(const std::set<std::string>& keep) {
  Held* oldest = nullptr;
  for (auto& [name, h] : held_) {
    if (!h.weights.resident || keep.count(name) != 0) continue;
    if (oldest == nullptr || h.last_step < oldest->last_step) oldest = &h;
  }
  return oldest;
}

void LoraResidency::evict(Held& held) {
  evict_lora(held.weights);
  held.evicted = true;
}

Status LoraResidency::make_resident(const std::set<std::string>& names) {
  if (names.empty()) return Status::ok();
  if (max_resident_ > 0 && static_cast<int>(names.size()) > max_resident_)
    return invalid_argument("the step names " + std::to_string(names.size()) + " LoRA adapters, more than lora.max_loras " +
                            std::to_string(max_resident_) + " resident at once");
  ++clock_;
  for (const std::string& name : names) {
    const auto h = held_.find(name);
    if (h == held_.end()) return invalid_argument("LoRA adapter \"" + name + "\" is not loaded here");
    Held& held = h->second;
    held.last_step = clock_;
    if (held.weights.resident) continue;
    // One resident adapter is not named: fewer than max_resident are.
    if (max_resident_ > 0 && resident_count() >= max_resident_) evict(*least_recently_used(names));
    place_lora(held.weights, backend_);
    if (held.evicted) ++reloads_;
    held.evicted = false;
  }
  return Status::ok();
}

}  // namespace tessera
