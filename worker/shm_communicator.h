#pragma once
// Shared-memory Communicator for CPU tensor-parallel ranks on one host, each rank its own
// process. The ranks meet in one POSIX shared-memory segment named after the group; the
// data moves through per-rank slots in that segment and the ranks stay in step through
// per-rank arrival counters on the shared page (spin, then yield, then futex). Nothing in
// the segment is a lock, so a dead peer can never leave the others blocked on it: every
// wait gives up after `timeout_ms` with Unavailable, naming the collective and the ranks
// that did not arrive.
//
// Results are identical bit for bit on every rank: every element is summed in rank order
// 0..N-1 (bf16 summed in f32 and rounded once), whoever computes it.
#include <cstddef>
#include <memory>
#include <string>

#include "common/communicator.h"
#include "common/status.h"

namespace tessera {

// Opens (rank 0: creates) the group's segment and waits, at most `timeout_ms`, until all
// `world_size` ranks have joined it. `max_bytes` bounds one rank's share of one step;
// larger messages are split into chunks transparently (the segment holds 2 x world_size
// slots of max_bytes, double-buffered so a small all_reduce needs one rendezvous).
// Every rank must pass the same group_name, world_size and max_bytes; a mismatch is
// InvalidArgument. A segment left behind by a crashed run of the same group is discarded
// by the new rank 0 (joiners detect it by its dead creator, a foreign join token or a
// replaced name). The name is unlinked as soon as every rank has joined, so a later crash
// leaves nothing behind.
StatusOr<std::unique_ptr<Communicator>> make_shm_communicator(const std::string& group_name, int rank,
                                                              int world_size, size_t max_bytes,
                                                              int timeout_ms = 30000);

// The POSIX shared-memory name a group uses: "/tessera-<group_name>".
std::string shm_segment_name(const std::string& group_name);

}  // namespace tessera
