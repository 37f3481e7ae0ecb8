#include "kernels/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

// cudaMalloc that fails loudly, naming the request and what this process already holds.
void* device_malloc(size_t bytes, const char* what, size_t in_use, size_t cached) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    ::tessera::detail::CheckFailure(__FILE__, __LINE__, "cudaMalloc").stream()
        << what << ": cannot allocate " << bytes << " bytes of device memory ("
        << describe_cuda_error(err) << "; " << in_use << " bytes in use and " << cached
        << " cached by this allocator, " << free_b << " of " << total_b << " free on the device)";
  }
  return p;
}

}  // namespace

// ---- DeviceArena ---------------------------------------------------------------------------

DeviceArena::~DeviceArena() {
  for (const Chunk& c : chunks_) cudaFree(c.base);  // errors at process exit are irrelevant
}

void* DeviceArena::allocate(size_t bytes) {
  const size_t need = align_up(bytes == 0 ? 1 : bytes, kDeviceAlignment);
  if (chunks_.empty() || chunks_.back().offset + need > chunks_.back().size) {
    const size_t size = std::max(chunk_bytes_, need);
    char* base = static_cast<char*>(device_malloc(size, "weight arena", used_, reserved_ - used_));
    chunks_.push_back({base, size, 0});
    reserved_ += size;
  }
  Chunk& c = chunks_.back();
  void* p = c.base + c.offset;
  c.offset += need;
  used_ += need;
  return p;
}

// ---- CachingAllocator ----------------------------------------------------------------------

CachingAllocator::~CachingAllocator() {
  for (auto& [size, p] : free_) cudaFree(p);
  // Blocks still in use belong to tensors that outlive the backend; their deleters call
  // release() on this object only while it exists (they hold a shared_ptr to it).
  for (auto& [p, size] : in_use_) cudaFree(p);
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < (size_t{1} << 20)) return align_up(bytes, 512);
  return align_up(bytes, size_t{2} << 20);
}

void* CachingAllocator::allocate_locked(size_t rounded) {
  // Best fit among cached blocks no more than twice the request: activations of varying
  // batch sizes reuse each other's blocks without a small request pinning a huge block.
  auto it = free_.lower_bound(rounded);
  if (it != free_.end() && it->first <= 2 * rounded) {
    const size_t size = it->first;
    void* p = it->second;
    free_.erase(it);
    bytes_cached_ -= size;
    in_use_[p] = size;
    bytes_in_use_ += size;
    return p;
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, rounded);
  if (err != cudaSuccess && !free_.empty()) {
    // Out of memory with blocks cached: give them back and try once more. The device must
    // be idle first (a cached block may still be read by queued work).
    cudaGetLastError();
    cudaDeviceSynchronize();
    for (auto& [size, q] : free_) cudaFree(q);
    free_.clear();
    bytes_cached_ = 0;
    err = cudaMalloc(&p, rounded);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    p = device_malloc(rounded, "Backend::alloc", bytes_in_use_, bytes_cached_);  // fails loudly
  }
  in_use_[p] = rounded;
  bytes_in_use_ += rounded;
  return p;
}

void* CachingAllocator::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return allocate_locked(round_size(bytes));
}

void CachingAllocator::release(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(ptr);
  TESSERA_CHECK(it != in_use_.end()) << "release of a pointer this allocator did not hand out";
  free_.emplace(it->second, ptr);
  bytes_cached_ += it->second;
  bytes_in_use_ -= it->second;
  in_use_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) TESSERA_CUDA_CHECK(cudaFree(p));
  free_.clear();
  bytes_cached_ = 0;
}

size_t CachingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_in_use_;
}

size_t CachingAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_cached_;
}

// ---- Workspace -----------------------------------------------------------------------------

Workspace::~Workspace() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

void* Workspace::get(size_t bytes, CUstream_st* stream) {
  if (bytes <= size_ && ptr_ != nullptr) return ptr_;
  size_t size = std::max<size_t>(size_t{1} << 20, size_);
  while (size < bytes) size *= 2;
  if (ptr_ != nullptr) {
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    TESSERA_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    size_ = 0;
  }
  ptr_ = device_malloc(size, "workspace", 0, 0);
  size_ = size;
  return ptr_;
}

// ---- StagingRing ---------------------------------------------------------------------------

StagingRing::~StagingRing() {
  for (Slot& s : slots_) {
    if (s.copied != nullptr) cudaEventDestroy(s.copied);
    if (s.host != nullptr) cudaFreeHost(s.host);
    if (s.device != nullptr) cudaFree(s.device);
  }
}

std::vector<const void*> StagingRing::upload(const std::vector<std::pair<const void*, size_t>>& spans,
                                             CUstream_st* stream) {
  size_t total = 0;
  std::vector<size_t> offsets;
  for (const auto& [ptr, bytes] : spans) {
    offsets.push_back(total);
    total += align_up(bytes, 16);
  }
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  if (slot.copied == nullptr) {
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  } else {
    // The pinned buffer may still be the source of this slot's previous copy.
    TESSERA_CUDA_CHECK(cudaEventSynchronize(slot.copied));
  }
  if (total > slot.capacity) {
    size_t cap = std::max<size_t>(4096, slot.capacity);
    while (cap < total) cap *= 2;
    // Queued kernels may still read the old device buffer.
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (slot.host != nullptr) TESSERA_CUDA_CHECK(cudaFreeHost(slot.host));
    if (slot.device != nullptr) TESSERA_CUDA_CHECK(cudaFree(slot.device));
    TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&slot.host), cap, cudaHostAllocDefault));
    slot.device = static_cast<char*>(device_malloc(cap, "staging", 0, 0));
    slot.capacity = cap;
  }
  std::vector<const void*> out;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].second > 0) std::memcpy(slot.host + offsets[i], spans[i].first, spans[i].second);
    out.push_back(slot.device + offsets[i]);
  }
  if (total > 0) {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(slot.device, slot.host, total, cudaMemcpyHostToDevice, stream));
  }
  TESSERA_CUDA_CHECK(cudaEventRecord(slot.copied, stream));
  return out;
}

}  // namespace tessera::cuda
