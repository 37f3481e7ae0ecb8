#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/weight_stager.h"

namespace tessera {
namespace {

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<char, FreeDeleter>;

// 64-byte aligned: what every kernel expects of a weight's start.
HostBuffer aligned_buffer(size_t bytes) {
  return HostBuffer(static_cast<char*>(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64)));
}

class HostWeightStager final : public WeightStager {
 public:
  char* host() override { return host_.get(); }
  char* slot(int s) override { return slots_[static_cast<size_t>(s)].get(); }
  void copy_in(int s, const char* from, size_t bytes) override { std::memcpy(slot(s), from, bytes); }
  void wait(int) override {}
  void release(int) override {}

  HostBuffer host_;
  std::vector<HostBuffer> slots_;
};

}  // namespace

StatusOr<std::unique_ptr<WeightStager>> make_host_weight_stager(size_t host_bytes, size_t slot_bytes, int slots) {
  auto s = std::make_unique<HostWeightStager>();
  s->host_ = aligned_buffer(host_bytes);
  if (s->host_ == nullptr)
    return resource_exhausted("weight staging: cannot allocate " + std::to_string(host_bytes) + " bytes of host memory");
  for (int i = 0; i < slots; ++i) {
    s->slots_.push_back(aligned_buffer(slot_bytes));
    if (s->slots_.back() == nullptr)
      return resource_exhausted("weight staging: cannot allocate a slot of " + std::to_string(slot_bytes) + " bytes");
  }
  return std::unique_ptr<WeightStager>(std::move(s));
}

}  // namespace tessera
