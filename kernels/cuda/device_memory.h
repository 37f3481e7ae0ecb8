#pragma once
// Device memory of the CUDA backend. Plain C++ header (the CUDA types are only forward
// declared), so cuda_backend.h stays free of CUDA headers too.
//
//   DeviceArena       aligned bump allocation in large chunks, freed all at once: weights.
//   CachingAllocator  Backend::alloc: blocks are kept on release and reused for later
//                     requests of a similar size (one stream, so stream order makes reuse
//                     safe without events); cudaMalloc only when no cached block fits.
//   Workspace         one growable scratch buffer (f16/bf16 copies of GEMM inputs).
//   StagingRing       pinned host slots + device twins for the small host-side arrays an
//                     op receives (batch metadata, positions, row lists).
// Every failure to get memory is a TESSERA_CHECK naming the size and what is in use.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

struct CUstream_st;
struct CUevent_st;

namespace tessera::cuda {

constexpr size_t kDeviceAlignment = 256;

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

class DeviceArena {
 public:
  explicit DeviceArena(size_t chunk_bytes = size_t{256} << 20) : chunk_bytes_(chunk_bytes) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Never returns nullptr (zero bytes still get an aligned, unique address).
  void* allocate(size_t bytes);
  size_t bytes_reserved() const { return reserved_; }
  size_t bytes_used() const { return used_; }

 private:
  struct Chunk {
    char* base;
    size_t size;
    size_t offset;
  };
  size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  size_t reserved_ = 0, used_ = 0;
};

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);
  // Returns a block to the cache (it is not handed back to CUDA until empty_cache()).
  void release(void* ptr);
  // cudaFree every cached block; the caller makes sure no queued work still uses them.
  void empty_cache();
  size_t bytes_in_use() const;
  size_t bytes_cached() const;

 private:
  static size_t round_size(size_t bytes);
  void* allocate_locked(size_t rounded);

  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;          // size -> block
  std::unordered_map<void*, size_t> in_use_;   // block -> size
  size_t bytes_in_use_ = 0, bytes_cached_ = 0;
};

class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  // At least `bytes` of device memory, valid until the next call. Growing waits for
  // `stream` first, so work still reading the old buffer finishes before it is freed.
  void* get(size_t bytes, CUstream_st* stream);

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class StagingRing {
 public:
  static constexpr int kSlots = 8;
  StagingRing() = default;
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Copies the host spans into one pinned slot, enqueues one host-to-device copy on
  // `stream` and returns each span's device address (16-byte aligned). The device copy
  // stays valid for the work enqueued after it on `stream` until kSlots more uploads
  // have been made: a slot is reused only after the event recorded after its copy.
  std::vector<const void*> upload(const std::vector<std::pair<const void*, size_t>>& spans, CUstream_st* stream);

 private:
  struct Slot {
    char* host = nullptr;
    char* device = nullptr;
    size_t capacity = 0;
    CUevent_st* copied = nullptr;
  };
  Slot slots_[kSlots];
  int next_ = 0;
};

}  // namespace tessera::cuda
