#include "kernels/cpu/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "common/check.h"

namespace tessera::cpu {
namespace {

// Below this a buffer comes from the C heap (64-byte aligned); from it on from mmap, with
// transparent huge pages asked for: where the kernel grants them, a fresh 8 MiB buffer
// faults 4 times instead of 2048.
constexpr size_t kMmapBytes = size_t{256} << 10;

void* allocate(size_t bytes, bool* fresh_zero) {
  if (bytes < kMmapBytes) {
    *fresh_zero = false;
    void* p = std::aligned_alloc(64, bytes);
    TESSERA_CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes";
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TESSERA_CHECK(p != MAP_FAILED) << "out of memory allocating " << bytes << " bytes: " << std::strerror(errno);
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: refused where THP is off
  *fresh_zero = true;
  return p;
}

void deallocate(void* p, size_t bytes) {
  if (bytes < kMmapBytes) {
    std::free(p);
  } else {
    munmap(p, bytes);
  }
}

}  // namespace

size_t BufferPool::size_class(size_t bytes) {
  if (bytes <= 256) return 256;
  // Four classes per power of two: 2^e, 1.25 * 2^e, 1.5 * 2^e, 1.75 * 2^e.
  const int e = std::bit_width(bytes - 1) - 1;  // 2^e < bytes <= 2^(e+1)
  const size_t quarter = size_t{1} << (e - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

size_t BufferPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

size_t BufferPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_bytes_;
}

size_t BufferPool::peak_held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_held_bytes_;
}

void BufferPool::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_bytes_ = bytes;
  make_room(0);
}

void BufferPool::make_room(size_t more) {
  if (limit_bytes_ == 0) return;
  // Any free buffer will do: one of the class asked for would have been taken already.
  for (auto it = free_.begin(); it != free_.end() && in_use_bytes_ + cached_bytes_ + more > limit_bytes_;) {
    std::vector<void*>& buffers = it->second;
    while (!buffers.empty() && in_use_bytes_ + cached_bytes_ + more > limit_bytes_) {
      deallocate(buffers.back(), it->first);
      buffers.pop_back();
      cached_bytes_ -= it->first;
    }
    it = buffers.empty() ? free_.erase(it) : std::next(it);
  }
}

void BufferPool::note_peak() { peak_held_bytes_ = std::max(peak_held_bytes_, in_use_bytes_ + cached_bytes_); }

Tensor BufferPool::zeros(const std::vector<int64_t>& dims, DType dtype) {
  const size_t bytes = TensorView(nullptr, dtype, dims).nbytes();
  if (bytes > kMaxPooledBytes) return Tensor::zeros(dims, dtype);
  size_t cls = size_class(bytes);
  void* p = nullptr;
  bool fresh = false;
  {
    // The request's own class, else the smallest cached one up to 4x larger: a step of a
    // shape not seen yet (a 128-token prompt after the start-up warm-up's 512) then reuses
    // warm memory instead of faulting fresh pages (first request 1.3-2x slower without).
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t c = cls; c <= 4 * cls; c = size_class(c + 1)) {
      auto it = free_.find(c);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= c;
        cls = c;
        break;
      }
    }
    if (p == nullptr) {
      fresh = true;
      make_room(cls);
    }
    in_use_bytes_ += cls;
    note_peak();
  }
  bool fresh_zero = false;
  if (fresh) p = allocate(cls, &fresh_zero);
  if (!fresh_zero) std::memset(p, 0, bytes);
  std::shared_ptr<BufferPool> self = shared_from_this();
  std::shared_ptr<const void> owner(p, [self, cls](const void* q) { self->release(const_cast<void*>(q), cls); });
  return Tensor::borrowed(TensorView(p, dtype, dims), std::move(owner));
}

void BufferPool::release(void* p, size_t cls) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ -= cls;
    // Kept while the pool stays within its limit: a buffer in use beyond it goes back now.
    const bool within_limit = limit_bytes_ == 0 || in_use_bytes_ + cached_bytes_ + cls <= limit_bytes_;
    if (cached_bytes_ + cls <= kMaxCachedBytes && within_limit) {
      free_[cls].push_back(p);
      cached_bytes_ += cls;
      return;
    }
  }
  deallocate(p, cls);
}

BufferPool::~BufferPool() {
  for (auto& [cls, buffers] : free_) {
    for (void* p : buffers) deallocate(p, cls);
  }
}

}  // namespace tessera::cpu
