#pragma once
// The Communicator of one rank of a tensor-parallel group, as worker.collectives says:
//   shm  - shared memory (worker/shm_communicator.h): CPU ranks on one host, one /dev/shm;
//   gloo - Gloo over TCP (worker/gloo_communicator.h): CPU ranks anywhere the network reaches;
//   nccl - NCCL: GPU ranks;
//   auto - NCCL for GPU ranks; for CPU ranks shared memory when every rank sees the same
//          /dev/shm of the same boot of the same machine (compared, not assumed from host
//          names: pods on one node have their own /dev/shm), Gloo otherwise.
// What the ranks must exchange to form the group (NCCL's unique id, Gloo's addresses, the
// /dev/shm identities) goes through the coordinator's control link (WorkerLink, CURVE when
// on), as blobs every rank publishes and the others receive.
#include <memory>
#include <string>

#include "common/communicator.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/gloo_communicator.h"
#include "worker/worker_link.h"

namespace tessera {

struct CollectiveGroupOptions {
  CollectivesKind kind = CollectivesKind::kAuto;  // the coordinator's worker.collectives
  int rank = 0;
  int world_size = 1;
  bool gpu = false;             // this rank's backend computes on a GPU
  std::string shm_group;        // the group's name for shared memory (Assignment::collective_bootstrap)
  std::string gloo_address;     // this worker's worker.collectives_address
  std::string gloo_interface;   // this worker's worker.collectives_interface
  int timeout_ms = 30000;       // forming the group, and each collective
};

// The group's communicator; errors name the key and what does not fit (nccl for CPU ranks,
// shm or gloo for GPU ranks, a peer that never published). World size 1: loopback.
StatusOr<std::unique_ptr<Communicator>> make_group_communicator(const CollectiveGroupOptions& options, WorkerLink& link);

// This process's /dev/shm as auto compares it: the machine's boot id and the folder's device
// and inode; "" when there is none (then no two ranks share one).
std::string shm_identity();

// A GlooRendezvous over the control link: a key set is published to the other ranks of this
// session's group; a get waits for a peer's.
std::unique_ptr<GlooRendezvous> make_link_rendezvous(WorkerLink& link);

}  // namespace tessera
