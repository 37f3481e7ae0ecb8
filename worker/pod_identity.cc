#include "worker/pod_identity.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <optional>

namespace tessera {
namespace {

bool parse_int(const std::string& s, int* out) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return false;
  *out = v;
  return true;
}

const std::string* get(const PodEnvironment& pod, const char* name) {
  auto it = pod.env.find(name);
  return it == pod.env.end() ? nullptr : &it->second;
}

Status env_int(const PodEnvironment& pod, const char* name, std::optional<int>* out) {
  const std::string* v = get(pod, name);
  if (v == nullptr) return Status::ok();
  int n = 0;
  if (!parse_int(*v, &n) || n < 0) {
    return invalid_argument(std::string(name) + "=" + *v + ": expected a non-negative integer");
  }
  *out = n;
  return Status::ok();
}

// The port of a tcp:// endpoint ("tcp://0.0.0.0:5560" -> "5560").
StatusOr<std::string> tcp_port_of(const std::string& endpoint, const std::string& what) {
  const size_t colon = endpoint.rfind(':');
  if (endpoint.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon < 6) {
    return invalid_argument(what + ": the coordinator's port comes from server.control, which is not tcp://HOST:PORT (" +
                            endpoint + ")");
  }
  const std::string port = endpoint.substr(colon + 1);
  int n = 0;
  if (!parse_int(port, &n) || n <= 0 || n > 65535) {
    return invalid_argument(what + ": server.control (" + endpoint + ") has no fixed port to connect to");
  }
  return port;
}

}  // namespace

PodEnvironment current_pod_environment() {
  PodEnvironment pod;
  for (const char* name :
       {"TESSERA_RANK", "TESSERA_CONTROL_ADDRESS", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE", "LWS_LEADER_ADDRESS"}) {
    if (const char* v = std::getenv(name)) pod.env[name] = v;
  }
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) == 0) pod.hostname = buf;
  return pod;
}

StatusOr<WorkerIdentity> resolve_worker_identity(const std::string& rank_flag, const TesseraConfig& config,
                                                 const PodEnvironment& pod) {
  WorkerIdentity id;
  id.world_size = config.parallel.tensor_parallel;
  const std::string world = std::to_string(id.world_size);

  std::optional<int> group_size;
  TESSERA_RETURN_IF_ERROR(env_int(pod, "LWS_GROUP_SIZE", &group_size));
  if (group_size && *group_size != id.world_size) {
    return invalid_argument("LWS_GROUP_SIZE=" + std::to_string(*group_size) + " but parallel.tensor_parallel = " +
                            world + ": the LeaderWorkerSet's size must equal the number of ranks");
  }

  if (!rank_flag.empty() && rank_flag != "auto") {
    if (!parse_int(rank_flag, &id.rank)) {
      return invalid_argument("--rank " + rank_flag + ": expected a rank (0-based integer) or 'auto'");
    }
    id.rank_source = "--rank";
  } else {
    std::optional<int> tessera_rank, lws_index;
    TESSERA_RETURN_IF_ERROR(env_int(pod, "TESSERA_RANK", &tessera_rank));
    TESSERA_RETURN_IF_ERROR(env_int(pod, "LWS_WORKER_INDEX", &lws_index));
    if (tessera_rank && lws_index && *tessera_rank != *lws_index) {
      return invalid_argument("TESSERA_RANK=" + std::to_string(*tessera_rank) + " and LWS_WORKER_INDEX=" +
                              std::to_string(*lws_index) + " disagree: set one of them (or pass --rank)");
    }
    if (tessera_rank) {
      id.rank = *tessera_rank;
      id.rank_source = "TESSERA_RANK";
    } else if (lws_index) {
      id.rank = *lws_index;
      id.rank_source = "LWS_WORKER_INDEX";
    } else {
      // A StatefulSet pod is NAME-ORDINAL; a fully qualified name keeps its first label.
      const std::string host = pod.hostname.substr(0, pod.hostname.find('.'));
      const size_t dash = host.rfind('-');
      if ((dash == std::string::npos || !parse_int(host.substr(dash + 1), &id.rank)) && rank_flag.empty()) {
        id.rank = 0;  // a hand-started worker without --rank, as before pods existed
        id.rank_source = "the default (no --rank, no pod environment)";
      } else if (dash == std::string::npos || !parse_int(host.substr(dash + 1), &id.rank)) {
        return invalid_argument("cannot tell this worker's rank: no --rank, no TESSERA_RANK or LWS_WORKER_INDEX in "
                                "the environment, and the hostname '" + pod.hostname +
                                "' does not end in -N (a StatefulSet pod's ordinal)");
      }
      if (id.rank_source.empty()) id.rank_source = "the hostname '" + pod.hostname + "'";
    }
  }
  if (id.rank < 0 || id.rank >= id.world_size) {
    const std::string what = id.rank_source == "--rank" ? "--rank " + std::to_string(id.rank)
                                                        : "rank " + std::to_string(id.rank) + " (from " +
                                                              id.rank_source + ")";
    return invalid_argument(what + " outside parallel.tensor_parallel = " + world + ": ranks are 0.." +
                            std::to_string(id.world_size - 1) +
                            (id.rank_source.rfind("the hostname", 0) == 0
                                 ? " (are there more StatefulSet replicas than tensor_parallel ranks?)"
                                 : ""));
  }

  if (const std::string* a = get(pod, "TESSERA_CONTROL_ADDRESS"); a != nullptr && !a->empty()) {
    id.address_source = "TESSERA_CONTROL_ADDRESS";
    if (a->find("://") != std::string::npos) {
      if (a->rfind("tcp://", 0) != 0 && a->rfind("ipc://", 0) != 0) {
        return invalid_argument("TESSERA_CONTROL_ADDRESS=" + *a + ": expected tcp://HOST:PORT, ipc://PATH, "
                                "HOST:PORT or HOST");
      }
      id.control_address = *a;
    } else if (a->find(':') != std::string::npos && a->find(':') == a->rfind(':')) {
      id.control_address = "tcp://" + *a;
    } else {
      TESSERA_ASSIGN_OR_RETURN(std::string port, tcp_port_of(config.server.control, "TESSERA_CONTROL_ADDRESS"));
      id.control_address = "tcp://" + *a + ":" + port;
    }
  } else if (const std::string* l = get(pod, "LWS_LEADER_ADDRESS"); l != nullptr && !l->empty()) {
    id.address_source = "LWS_LEADER_ADDRESS";
    TESSERA_ASSIGN_OR_RETURN(std::string port, tcp_port_of(config.server.control, "LWS_LEADER_ADDRESS"));
    id.control_address = "tcp://" + *l + ":" + port;
  } else if (!config.worker.control_address.empty()) {
    id.address_source = "worker.control_address";
    id.control_address = config.worker.control_address;
  } else {
    id.address_source = "server.control";
    id.control_address = config.server.control;
  }
  return id;
}

}  // namespace tessera
