#pragma once
// The NCCL Communicator for GPU tensor-parallel ranks (one process and one device per
// rank). Plain C++ header: callers never see NCCL or CUDA headers. Buffers passed to its
// collectives are device pointers on the rank's device.
//
// The group is born from a unique id that rank 0 makes (make_nccl_unique_id) and the
// coordinator relays to the other ranks (WorkerLink::share_collective_id; docs/wire.md).
// Creation and every collective are non-blocking NCCL calls polled against a deadline, so a
// peer that died makes them fail with Unavailable (the communicator is then aborted)
// instead of hanging the rank forever, as the Communicator contract requires.
#include <memory>
#include <string>

#include "common/communicator.h"
#include "common/status.h"

namespace tessera {

// NCCL's opaque unique id (128 bytes) for a new group; Unavailable without a usable device.
StatusOr<std::string> make_nccl_unique_id();

// Joins the group of `world_size` ranks as `rank`, on CUDA device `device`. Waits at most
// `timeout_ms` for every rank to join, and bounds each later collective by the same time.
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const std::string& unique_id, int rank,
                                                               int world_size, int device, int timeout_ms = 60000);

}  // namespace tessera
