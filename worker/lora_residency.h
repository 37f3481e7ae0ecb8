#pragma once
// The LoRA adapters one rank holds, and which of them are resident (placed on the backend,
// where the forward reads them). Under lora.max_loras at most that many are resident; a step
// naming others brings them back from their host copies, the least recently used resident
// ones that the step does not name leaving first (vLLM's max_loras slots over its CPU cache).
// The scheduler admits sequences so that the running ones name at most max_loras adapters
// (SchedulerConfig::max_loras), so a step never needs more.
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"
#include "worker/lora_weights.h"

namespace tessera {

class LoraResidency {
 public:
  explicit LoraResidency(Backend& backend) : backend_(backend) {}

  // 0: every adapter held is resident. Lowering it evicts the least recently used.
  void set_max_resident(int max_resident);
  int max_resident() const { return max_resident_; }

  // Holds `adapter` (replacing one of the same name), resident at once while there is room.
  void add(LoraWeights adapter);
  bool remove(const std::string& name);
  // The held adapter of that name, or nullptr.
  const LoraWeights* find(const std::string& name) const;

  // Makes every adapter in `names` resident for the coming step (each must be held), evicting
  // the least recently used resident ones not named; an error when more are named than can
  // be resident at once.
  Status make_resident(const std::set<std::string>& names);

  int resident_count() const;
  // Adapters placed again after an eviction, since the start (a measure of thrashing).
  int64_t reloads() const { return reloads_; }

 private:
  struct Held {
    LoraWeights weights;
    uint64_t last_step = 0;  // of make_resident's calls; 0: never named
    bool evicted = false;    // placed again when next named counts as a reload
  };
  // The resident adapter not in `keep` used least recently, or nullptr.
  Held* least_recently_used(const std::set<std::string>& keep);
  void evict(Held& held);

  Backend& backend_;
  int max_resident_ = 0;
  std::map<std::string, Held> held_;  // by name
  uint64_t clock_ = 0;
  int64_t reloads_ = 0;
};

}  // namespace tessera
