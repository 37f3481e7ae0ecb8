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
  // A load at run time: reserve the name (false when it is served or being loaded), then
  // serve it once every executor holds the adapter, or give the name back.
  bool reserve(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return adapters_.count(name) == 0 && loading_.insert(name).second;
  }
  void finish_load(const std::string& name, const std::string& path, bool loaded) {
    std::lock_guard<std::mutex> lock(mu_);
    loading_.erase(name);
    if (loaded) adapters_.emplace(name, path);
  }
  // False when the name is not served.
  bool remove(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return adapters_.erase(name) > 0;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> adapters_;
  std::set<std::string> loading_;
};

}  // namespace tessera
