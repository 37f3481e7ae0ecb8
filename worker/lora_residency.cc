#include "worker/lora_residency.h"

namespace tessera {

void LoraResidency::set_max_resident(int max_resident) {
  max_resident_ = max_resident;
  while (max_resident_ > 0 && resident_count() > max_resident_) {
    LoraWeights* victim = least_recently_used({});
    evict_lora(*victim);
    uses_[victim->name].evicted = true;
  }
}

void LoraResidency::add(LoraWeights adapter) {
  std::string name = adapter.name;
  adapters_.erase(name);
  uses_[name] = Use{};
  LoraWeights& held = adapters_.emplace(std::move(name), std::move(adapter)).first->second;
  evict_lora(held);
  if (max_resident_ == 0 || resident_count() < max_resident_) place_lora(held, backend_);
}

bool LoraResidency::remove(const std::string& name) {
  uses_.erase(name);
  return adapters_.erase(name) > 0;
}

const LoraWeights* LoraResidency::find(const std::string& name) const {
  const auto a = adapters_.find(name);
  return a == adapters_.end() ? nullptr : &a->second;
}

int LoraResidency::resident_count() const {
  int n = 0;
  for (const auto& [name, a] : adapters_) n += a.resident ? 1 : 0;
  return n;
}

LoraWeights* LoraResidency::least_recently_used(const std::set<std::string>& keep) {
  LoraWeights* oldest = nullptr;
  uint64_t oldest_step = 0;
  for (auto& [name, a] : adapters_) {
    if (!a.resident || keep.count(name) != 0) continue;
    const uint64_t step = uses_[name].last_step;
    if (oldest == nullptr || step < oldest_step) {
      oldest = &a;
      oldest_step = step;
    }
  }
  return oldest;
}

Status LoraResidency::make_resident(const std::set<std::string>& names) {
  if (names.empty()) return Status::ok();
  if (max_resident_ > 0 && static_cast<int>(names.size()) > max_resident_)
    return invalid_argument("the step names " + std::to_string(names.size()) + " LoRA adapters, more than lora.max_loras " +
                            std::to_string(max_resident_) + " resident at once");
  ++clock_;
  for (const std::string& name : names) {
    const auto a = adapters_.find(name);
    if (a == adapters_.end()) return invalid_argument("LoRA adapter \"" + name + "\" is not loaded here");
    Use& use = uses_[name];
    use.last_step = clock_;
    if (a->second.resident) continue;
    if (max_resident_ > 0 && resident_count() >= max_resident_) {
      LoraWeights* victim = least_recently_used(names);
      evict_lora(*victim);  // one exists: fewer than max_resident are named
      uses_[victim->name].evicted = true;
    }
    place_lora(a->second, backend_);
    if (use.evicted) ++reloads_;
    use.evicted = false;
  }
  return Status::ok();
}

}  // namespace tessera
