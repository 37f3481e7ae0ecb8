#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

Status unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }

std::string nccl_error(ncclResult_t r) { return std::string(ncclGetErrorString(r)); }

Status cuda_error(const char* what, cudaError_t e) {
  return unavailable(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// f32 and bf16 are what the model moves; anything else is a caller bug reported as such.
StatusOr<ncclDataType_t> nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    default: return invalid_argument(std::string("nccl: unsupported dtype ") + dtype_name(dtype));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int world, int device, int timeout_ms)
      : comm_(comm), stream_(stream), rank_(rank), world_(world), device_(device), timeout_ms_(timeout_ms) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        wait_comm_idle();
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }

  Status all_reduce_sum(void* data, int64_t count, DType dtype) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
    return run("all_reduce", [&] { return ncclAllReduce(data, data, static_cast<size_t>(count), t, ncclSum, comm_, stream_); });
  }
  Status all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
    return run("all_gather", [&] { return ncclAllGather(send, recv, static_cast<size_t>(count), t, comm_, stream_); });
  }
  Status broadcast(void* data, int64_t count, DType dtype, int root) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
    if (root < 0 || root >= world_) return invalid_argument("nccl broadcast: root " + std::to_string(root) + " out of range");
    return run("broadcast", [&] { return ncclBroadcast(data, data, static_cast<size_t>(count), t, root, comm_, stream_); });
  }
  Status barrier() override {
    if (!scratch_) {
      if (cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess) return cuda_error("nccl barrier", e);
      cudaMemset(scratch_, 0, sizeof(float));
    }
    return run("barrier", [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

 private:
  // Enqueues one collective and waits for it, bounded by the deadline. The caller's earlier
  // device work (on the backend's stream) must be complete first: NCCL runs on its own
  // stream here, so the device is synchronised before the call. (Sharing the backend's
  // stream, to overlap, is the CUDA backend's later optimisation.)
  template <typename Fn>
  Status run(const char* what, Fn&& enqueue) {
    const std::string tag = std::string("nccl ") + what + " (rank " + std::to_string(rank_) + "/" +
                            std::to_string(world_) + ")";
    if (broken_) return unavailable(tag + ": the group is broken by an earlier failure");
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return cuda_error(tag.c_str(), e);
    if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_error(tag.c_str(), e);
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) return fail(tag + ": " + nccl_error(r));
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    for (;;) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return fail(tag + ": " + nccl_error(async));
      if (async == ncclSuccess) {
        const cudaError_t q = cudaStreamQuery(stream_);
        if (q == cudaSuccess) return Status::ok();
        if (q != cudaErrorNotReady) return fail(tag + ": " + cudaGetErrorString(q));
      }
      if (Clock::now() > deadline)
        return fail(tag + ": not complete after " + std::to_string(timeout_ms_) + " ms (a peer is gone or stuck)");
      std::this_thread::yield();
    }
  }

  Status fail(std::string msg) {
    broken_ = true;  // the destructor aborts the communicator instead of finalising it
    return unavailable(std::move(msg));
  }

  void wait_comm_idle() {
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    ncclResult_t async = ncclInProgress;
    while (async == ncclInProgress && Clock::now() < deadline) {
      ncclCommGetAsyncError(comm_, &async);
      std::this_thread::yield();
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_, world_, device_, timeout_ms_;
  bool broken_ = false;
  void* scratch_ = nullptr;
};

}  // namespace

StatusOr<std::string> make_nccl_unique_id() {
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    return unavailable("ncclGetUniqueId failed: " + nccl_error(r));
  return std::string(id.internal, sizeof(id.internal));
}

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const std::string& unique_id, int rank,
                                                               int world_size, int device, int timeout_ms) {
  const std::string tag = "nccl (rank " + std::to_string(rank) + "/" + std::to_string(world_size) + ", device " +
                          std::to_string(device) + ")";
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal))
    return invalid_argument(tag + ": the collective id has " + std::to_string(unique_id.size()) +
                            " bytes, NCCL's unique id has " + std::to_string(sizeof(id.internal)));
  if (rank < 0 || rank >= world_size) return invalid_argument(tag + ": rank out of range");
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return cuda_error(tag.c_str(), e);
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return cuda_error(tag.c_str(), e);

  // Non-blocking creation, polled: a rank that never joins is a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    cudaStreamDestroy(stream);
    return unavailable(tag + ": ncclCommInitRankConfig failed: " + nccl_error(r));
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclInProgress && Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return unavailable(tag + (state == ncclInProgress
                                  ? ": not every rank joined within " + std::to_string(timeout_ms) + " ms"
                                  : ": joining the group failed: " + nccl_error(state)));
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, stream, rank, world_size, device, timeout_ms));
}

}  // namespace tessera
