#include "kernels/cuda/cuda_weight_stager.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace tessera::cuda {
namespace {

// Host memory the device copies from by DMA (pinned), slots in device memory, a copy stream,
// and two events per slot: `copied` (recorded on the copy stream after its copy; the compute
// stream waits for it) and `released` (recorded on the compute stream after the ops that read
// the slot; the copy stream waits for it before overwriting the slot).
class CudaWeightStager final : public WeightStager {
 public:
  CudaWeightStager(int device, cudaStream_t compute) : device_(device), compute_(compute) {}
  ~CudaWeightStager() override {
    cudaSetDevice(device_);
    if (copy_ != nullptr) cudaStreamSynchronize(copy_);
    for (cudaEvent_t e : copied_) cudaEventDestroy(e);
    for (cudaEvent_t e : released_) cudaEventDestroy(e);
    for (void* p : slots_) cudaFree(p);
    if (copy_ != nullptr) cudaStreamDestroy(copy_);
    if (host_ != nullptr) cudaFreeHost(host_);
  }

  Status init(size_t host_bytes, size_t slot_bytes, int slots) {
    TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (cudaHostAlloc(reinterpret_cast<void**>(&host_), std::max<size_t>(host_bytes, 1), cudaHostAllocDefault) !=
        cudaSuccess) {
      cudaGetLastError();
      host_ = nullptr;
      return resource_exhausted("model.weights_memory_budget: cannot pin " + std::to_string(host_bytes) +
                                " bytes of host memory for the streamed weights");
    }
    TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    for (int s = 0; s < slots; ++s) {
      void* p = nullptr;
      if (cudaMalloc(&p, std::max<size_t>(slot_bytes, 1)) != cudaSuccess) {
        cudaGetLastError();
        return resource_exhausted("model.weights_memory_budget: cannot allocate " + std::to_string(slots) +
                                  " device buffers of " + std::to_string(slot_bytes) +
                                  " bytes for the streamed weights (model.weights_prefetch_layers)");
      }
      slots_.push_back(p);
      cudaEvent_t copied = nullptr, released = nullptr;
      TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
      copied_.push_back(copied);
      TESSERA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&released, cudaEventDisableTiming));
      released_.push_back(released);
      // Recorded once so that the first copy into the slot has something to wait for.
      TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(released, compute_));
    }
    return Status::ok();
  }

  char* host() override { return host_; }
  char* slot(int s) override { return static_cast<char*>(slots_[static_cast<size_t>(s)]); }
  void copy_in(int s, const char* from, size_t bytes) override {
    const auto i = static_cast<size_t>(s);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(copy_, released_[i], 0));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(slots_[i], from, bytes, cudaMemcpyHostToDevice, copy_));
    TESSERA_CUDA_CHECK(cudaEventRecord(copied_[i], copy_));
  }
  void wait(int s) override { TESSERA_CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_[static_cast<size_t>(s)], 0)); }
  void release(int s) override { TESSERA_CUDA_CHECK(cudaEventRecord(released_[static_cast<size_t>(s)], compute_)); }

 private:
  int device_;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  char* host_ = nullptr;
  std::vector<void*> slots_;
  std::vector<cudaEvent_t> copied_, released_;
};

}  // namespace

StatusOr<std::unique_ptr<WeightStager>> make_cuda_weight_stager(int device, CUstream_st* compute, size_t host_bytes,
                                                                size_t slot_bytes, int slots) {
  auto stager = std::make_unique<CudaWeightStager>(device, compute);
  TESSERA_RETURN_IF_ERROR(stager->init(host_bytes, slot_bytes, slots));
  return std::unique_ptr<WeightStager>(std::move(stager));
}

}  // namespace tessera::cuda
