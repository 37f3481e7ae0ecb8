#pragma once
// The CPU backend's activation memory: zeroed buffers recycled between ops and steps.
//
// Why: a forward pass allocates a dozen activation tensors per layer (backend.alloc), and a
// 512-token prefill's are megabytes each. Fresh from the kernel, every 4 KiB page of them
// page-faults on first write — on a virtual machine ~290k faults per 512-token prefill of the
// ~100M Llama, about a third of the step (perf, docs/performance-cpu.md) — and freed, they go back
// to the kernel to fault again in the next layer. The pool keeps freed buffers by size class
// and hands them out again, cleared with memset (a few GB/s cheaper than faulting the pages):
// of the request's class, or else the smallest cached class up to 4x larger.
//
// Bounds: sizes are rounded up to classes a quarter of a power of two apart (at most 25%
// slack), at most kMaxCachedBytes of free buffers are kept (the rest go back to the
// kernel), and buffers above kMaxPooledBytes are never kept: they come straight from mmap,
// lazily zero, as Tensor::zeros gives them. With a limit (set_limit: the worker's planned
// activation memory, worker/activation_memory.h) the pool holds at most that much, buffers
// in use and free ones together: a buffer that must be made fresh first sends free ones back
// to the kernel. Only buffers in use beyond the limit take it further (the plan was short).
#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/tensor.h"

namespace tessera::cpu {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kMaxPooledBytes = size_t{256} << 20;
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  static std::shared_ptr<BufferPool> create() { return std::shared_ptr<BufferPool>(new BufferPool()); }
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  // A zeroed tensor of `dims` x `dtype` whose memory returns to this pool when the last
  // reference to it goes.
  Tensor zeros(const std::vector<int64_t>& dims, DType dtype);

  // At most `bytes` held, in use and free together (0: no limit beyond kMaxCachedBytes free).
  void set_limit(size_t bytes);

  // The size class of a request (bytes actually reserved); exposed for tests.
  static size_t size_class(size_t bytes);
  size_t cached_bytes() const;
  size_t in_use_bytes() const;
  // The most held at once (in use and free) since made.
  size_t peak_held_bytes() const;

 private:
  BufferPool() = default;
  void release(void* p, size_t bytes);
  // Sends free buffers back to the kernel until `more` bytes fit under the limit (or none are
  // left). Called with mu_ held.
  void make_room(size_t more);
  void note_peak();  // with mu_ held

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> free buffers
  size_t cached_bytes_ = 0;
  size_t in_use_bytes_ = 0;
  size_t limit_bytes_ = 0;
  size_t peak_held_bytes_ = 0;
};

}  // namespace tessera::cpu
