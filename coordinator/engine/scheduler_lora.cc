// The scheduler's LoRA adapters beyond the step path: the loads and unloads that ride on the
// plans (run-time updates, docs/lora.md) and the admission rule of lora.max_loras.
#include <algorithm>

#include "coordinator/engine/scheduler.h"

namespace tessera {

void Scheduler::add_lora_load(const std::string& name, const std::string& dir) {
  lora_loads_.emplace_back(name, dir);
  runtime_loras_[name] = dir;
}

void Scheduler::add_lora_unload(const std::string& name) {
  lora_unloads_.push_back(name);
  runtime_loras_.erase(name);
}

bool Scheduler::uses_lora(const std::string& name) const {
  const auto named = [&](const Entry* e) { return e->seq.request().lora == name; };
  return std::any_of(running_.begin(), running_.end(), named) || std::any_of(waiting_.begin(), waiting_.end(), named);
}

void Scheduler::take_lora_changes(StepPlan& plan) {
  plan.lora_loads = std::move(lora_loads_);
  lora_loads_.clear();
  for (auto it = lora_unloads_.begin(); it != lora_unloads_.end();) {
    if (uses_lora(*it)) {
      ++it;
    } else {
      plan.lora_unloads.push_back(*it);
      it = lora_unloads_.erase(it);
    }
  }
}

void Scheduler::resend_runtime_loras() {
  for (const auto& adapter : runtime_loras_) {
    const auto queued = [&](const auto& load) { return load.first == adapter.first; };
    if (std::find_if(lora_loads_.begin(), lora_loads_.end(), queued) == lora_loads_.end())
      lora_loads_.push_back(adapter);
  }
}

Scheduler::LoraAdmission Scheduler::lora_admission() const {
  LoraAdmission a;
  if (config_.max_loras > 0)
    for (const Entry* r : running_) a.running.insert(r->seq.request().lora);
  return a;
}

bool Scheduler::admits_lora(LoraAdmission& admission, const std::string& lora) const {
  if (config_.max_loras == 0 || lora.empty()) return true;
  if (!admission.passed_over && admission.running.count(lora) != 0) return true;
  const auto adapters = static_cast<int>(admission.running.size() - admission.running.count(""));
  if (!admission.passed_over && adapters < config_.max_loras) return true;
  admission.passed_over = true;
  return false;
}

}  // namespace tessera
