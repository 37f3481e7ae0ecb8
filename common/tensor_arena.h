#pragma once
// Host tensors carved out of a few large zeroed chunks (Tensor::zeros: lazily mapped, on
// huge pages where the kernel grants them), for many long-lived tensors of which most are
// smaller than a huge page: the weights. Each tensor on its own would sit on 4 KiB pages
// (below 2 MiB Tensor::zeros uses the C heap), and a model's weights are read whole every
// step, where a TLB miss per 4 KiB page costs (docs/benchmarks.md: ~100M int8 weights of
// 0.6–1.8 MB each). Unused chunk tails are never touched, so they take no memory.
//
// A chunk lives as long as any tensor carved from it; not thread-safe.
#include <cstddef>
#include <vector>

#include "common/tensor.h"

namespace tessera {

class TensorArena {
 public:
  // Tensors of at least `chunk_bytes` get a chunk of their own.
  explicit TensorArena(size_t chunk_bytes = size_t{32} << 20) : chunk_bytes_(chunk_bytes) {}
  // A zeroed tensor, 64-byte aligned.
  Tensor zeros(const std::vector<int64_t>& dims, DType dtype);

 private:
  size_t chunk_bytes_;
  Tensor chunk_;       // the chunk being carved
  size_t used_ = 0;    // bytes of it handed out
};

}  // namespace tessera
