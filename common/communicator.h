#pragma once
// Collectives between the tensor-parallel ranks of one model: the data plane, separate
// from the ZeroMQ control plane. Passed explicitly (never a global rank) to whatever needs
// it. Implementations: loopback (world size 1), shared memory (CPU ranks on one host), NCCL
// (GPU ranks; compiled with CUDA). Buffers live where the implementation's backend keeps
// tensors (host memory for loopback and shared memory, device memory for NCCL).
//
// Every rank must call the same collectives in the same order with the same sizes; a
// collective that cannot complete (a peer died) returns an error instead of hanging forever.
#include <cstdint>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "common/status.h"

namespace tessera {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "loopback", "shm", "nccl"

  // In place: data[i] = sum over ranks of data[i]. dtype f32 or bf16 (bf16 is summed in f32).
  virtual Status all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  // recv = concat over ranks (rank order) of each rank's `count` elements of send.
  virtual Status all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // data on every rank = data on `root`.
  virtual Status broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual Status barrier() = 0;
};

// World size 1: every collective is a no-op (all_gather copies).
std::unique_ptr<Communicator> make_loopback_communicator();

}  // namespace tessera
