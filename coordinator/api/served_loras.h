#pragma once
// The LoRA adapters a server serves beside its model (name -> PEFT folder), shared by its
// front ends (HTTP, ZeroMQ, the Batch API) and changed while it runs (/v1/load_lora_adapter,
// /v1/unload_lora_adapter): every read takes a consistent snapshot under a lock.
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace tessera {

class ServedLoras {
 public:
  explicit ServedLoras(std::map<std::string, std::string> adapters = {}) : adapters_(std::move(adapters)) {}

  std::map<std::string, std::string> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return adapters_;
  }
  // A load at run time: reserve the name (false when it is served, being loaded, or being
  // dropped: requests may still run with the old adapter of that name), then serve it once
  // every executor holds the adapter, or give the name back.
  bool reserve(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return adapters_.count(name) == 0 && unloading_.count(name) == 0 && loading_.insert(name).second;
  }
  void finish_load(const std::string& name, const std::string& path, bool loaded) {
    std::lock_guard<std::mutex> lock(mu_);
    loading_.erase(name);
    if (loaded) adapters_.emplace(name, path);
  }
  // An unload at run time: stop serving the name (false when it is not served); it cannot be
  // loaded again until finish_unload (the executors dropped the adapter).
  bool remove(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    if (adapters_.erase(name) == 0) return false;
    unloading_.insert(name);
    return true;
  }
  void finish_unload(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    unloading_.erase(name);
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> adapters_;
  std::set<std::string> loading_, unloading_;
};

}  // namespace tessera
