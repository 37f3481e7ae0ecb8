#pragma once
// Host buffers handed out again once the tensors made from them are gone: load-time scratch
// that is written whole and dropped within a layer (the copy of a fused QKV's or gate-up's
// ggml blocks that the 4-bit packer reads once). A fresh Tensor::zeros is a fresh mapping, and
// on a virtual machine the first touch of fresh pages can cost more than everything done
// with them (start-up of a ~1.1B q4_K_M file on the 2-core host of docs/benchmarks.md: 0.6 s
// in one run, 1.7 s in the next, the difference in page clearing); recycled, only the first
// layer's scratch is fresh.
//
// A tensor from take() keeps its buffer out of the pool for as long as any copy of it lives;
// the pool itself may go first. Thread-safe.
#include <cstdint>
#include <memory>
#include <vector>

#include "common/tensor.h"

namespace tessera {

class RecycledBuffers {
 public:
  RecycledBuffers();
  // A 64-byte-aligned host tensor of `dims`; its bytes are whatever the last user left.
  Tensor take(const std::vector<int64_t>& dims, DType dtype);
  // Bytes held by free buffers (tests).
  size_t free_bytes() const;

 private:
  struct Pool;
  std::shared_ptr<Pool> pool_;
};

}  // namespace tessera
