#pragma once
// Weights streamed to a device that computes in memory of its own (ZeRO-Inference's offload
// of parameters to host memory, docs/configuration.md model.weights_memory_budget): the
// streamed weights stay in host memory the device copies from directly (pinned, on CUDA),
// and each is copied into one of a few device buffers (slots) ahead of the step that uses
// it. On CUDA the copies run on a stream of their own, so that copying the next units
// overlaps computing this one; events order them against the compute stream both ways (a
// unit's ops wait for its copy; a slot is overwritten only once the ops that read it ran).
//
// Made by Backend::make_weight_stager; worker/staged_weights.h decides what goes where.
#include <cstddef>
#include <memory>

#include "common/status.h"

namespace tessera {

class WeightStager {
 public:
  virtual ~WeightStager() = default;
  // Host memory of the host_bytes asked for, which slots are copied from (lives as long as
  // the stager; pinned on CUDA).
  virtual char* host() = 0;
  // Device buffer s of the slot_bytes asked for (0 <= s < slots).
  virtual char* slot(int s) = 0;
  // Starts copying [from, from + bytes) of host() into slot s, once the ops that read the
  // slot before its last release() ran.
  virtual void copy_in(int s, const char* from, size_t bytes) = 0;
  // Ops enqueued from now on run after slot s's last copy_in finished.
  virtual void wait(int s) = 0;
  // The ops enqueued so far are the last to read slot s before its next copy_in.
  virtual void release(int s) = 0;
};

// Slots in host memory too, copied synchronously (memcpy): the CPU backend's stager, which
// runs the device path's bookkeeping where there is no device (its tests).
StatusOr<std::unique_ptr<WeightStager>> make_host_weight_stager(size_t host_bytes, size_t slot_bytes, int slots);

}  // namespace tessera
