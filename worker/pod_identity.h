#pragma once
// Who a worker process is, in a pod: its rank, the world size and where the coordinator is,
// from the command line, the pod's environment and its hostname (docs/deployment.md).
//
// Rank: `--rank R` wins; with `--rank auto` (or no --rank) it comes from TESSERA_RANK or
// LWS_WORKER_INDEX (LeaderWorkerSet; both set and different is an error), else from the
// hostname's ordinal suffix (a StatefulSet pod `tessera-worker-3` is rank 3); with no --rank
// at all and none of these, rank 0 (explicit `--rank auto` then is an error).
// World size: parallel.tensor_parallel; LWS_GROUP_SIZE, when set, must equal it.
// Coordinator: TESSERA_CONTROL_ADDRESS (tcp://HOST:PORT, HOST:PORT or HOST), else
// LWS_LEADER_ADDRESS (a host; the port is server.control's), else worker.control_address,
// else server.control.
#include <map>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace tessera {

struct PodEnvironment {
  std::map<std::string, std::string> env;  // only the variables that are set
  std::string hostname;
};

// TESSERA_RANK, TESSERA_CONTROL_ADDRESS, LWS_WORKER_INDEX, LWS_GROUP_SIZE,
// LWS_LEADER_ADDRESS from this process's environment, and gethostname().
PodEnvironment current_pod_environment();

struct WorkerIdentity {
  int rank = 0;
  int world_size = 1;
  std::string control_address;  // the ZeroMQ endpoint to connect to
  std::string rank_source;      // "--rank", "TESSERA_RANK", "LWS_WORKER_INDEX", "hostname 'x-1'"
  std::string address_source;   // "TESSERA_CONTROL_ADDRESS", ..., "server.control"
};

// `rank_flag` is the --rank value: a number, "auto" or "" (absent).
StatusOr<WorkerIdentity> resolve_worker_identity(const std::string& rank_flag, const TesseraConfig& config,
                                                 const PodEnvironment& pod);

}  // namespace tessera
