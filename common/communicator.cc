#include "common/communicator.h"

#include <cstring>

namespace tessera {
namespace {

class LoopbackCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "loopback"; }
  Status all_reduce_sum(void*, int64_t, DType) override { return Status::ok(); }
  Status all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(count) * dtype_size(dtype));
    return Status::ok();
  }
  Status broadcast(void*, int64_t, DType, int root) override {
    if (root != 0) return invalid_argument("broadcast root " + std::to_string(root) + " in a world of 1");
    return Status::ok();
  }
  Status barrier() override { return Status::ok(); }
};

}  // namespace

std::unique_ptr<Communicator> make_loopback_communicator() { return std::make_unique<LoopbackCommunicator>(); }

}  // namespace tessera
