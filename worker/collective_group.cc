#include "worker/collective_group.h"

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <map>

#include "common/logging.h"
#include "worker/shm_communicator.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/cuda_probe.h"
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace tessera {
namespace collective_group_internal {

// Largest message one shared-memory slot holds; bigger collectives are chunked.
constexpr size_t kShmSlotBytes = size_t{4} << 20;
// Blob prefixes on the control link (one link carries every kind).
constexpr const char* kGlooKey = "gloo-key:";
constexpr const char* kShmIdentity = "shm-identity:";

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

class LinkRendezvous final : public GlooRendezvous {
 public:
  explicit LinkRendezvous(WorkerLink& link) : link_(link) {}
  Status set(const std::string& key, const std::string& value) override {
    own_[key] = value;
    return link_.publish_collective_blob(kGlooKey + key + "\n" + value);
  }
  StatusOr<std::string> get(const std::string& key, int timeout_ms) override {
    if (const auto own = own_.find(key); own != own_.end()) return own->second;
    const std::string prefix = kGlooKey + key + "\n";
    TESSERA_ASSIGN_OR_RETURN(std::string blob, link_.wait_collective_blob(
                                                   -1, [&](const std::string& b) { return starts_with(b, prefix); },
                                                   std::chrono::milliseconds(timeout_ms)));
    return blob.substr(prefix.size());
  }

 private:
  WorkerLink& link_;
  std::map<std::string, std::string> own_;
};

// Whether every rank's /dev/shm is this rank's: each publishes its identity, reads the others'.
StatusOr<bool> all_share_shm(WorkerLink& link, const CollectiveGroupOptions& o) {
  const std::string mine = shm_identity();
  TESSERA_RETURN_IF_ERROR(link.publish_collective_blob(kShmIdentity + mine));
  bool same = !mine.empty();
  for (int r = 0; r < o.world_size; ++r) {
    if (r == o.rank) continue;
    TESSERA_ASSIGN_OR_RETURN(std::string theirs,
                             link.wait_collective_blob(
                                 r, [](const std::string& b) { return starts_with(b, kShmIdentity); },
                                 std::chrono::milliseconds(o.timeout_ms)));
    same = same && theirs == kShmIdentity + mine;
  }
  return same;
}

StatusOr<std::unique_ptr<Communicator>> make_nccl(WorkerLink& link, const CollectiveGroupOptions& o) {
#ifdef TESSERA_WITH_CUDA
  std::string id;
  if (o.rank == 0) {
    TESSERA_ASSIGN_OR_RETURN(id, make_nccl_unique_id());
  }
  TESSERA_ASSIGN_OR_RETURN(id, link.share_collective_id(id, std::chrono::minutes(5)));
  return make_nccl_communicator(id, o.rank, o.world_size, o.rank % std::max(1, cuda::device_count()));
#else
  (void)link;
  (void)o;
  return unimplemented("GPU ranks need NCCL, and this build has no CUDA support");
#endif
}

}  // namespace collective_group_internal

std::string shm_identity() {
  struct stat st = {};
  if (::stat("/dev/shm", &st) != 0) return "";
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  return boot_id + ":" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

std::unique_ptr<GlooRendezvous> make_link_rendezvous(WorkerLink& link) {
  return std::make_unique<collective_group_internal::LinkRendezvous>(link);
}

StatusOr<std::unique_ptr<Communicator>> make_group_communicator(const CollectiveGroupOptions& o, WorkerLink& link) {
  namespace cgi = collective_group_internal;
  if (o.world_size == 1) return make_loopback_communicator();
  CollectivesKind kind = o.kind;
  std::string why;
  if (kind == CollectivesKind::kAuto) {
    if (o.gpu) {
      kind = CollectivesKind::kNccl;
      why = "GPU ranks";
    } else {
      TESSERA_ASSIGN_OR_RETURN(const bool shared, cgi::all_share_shm(link, o));
      kind = shared ? CollectivesKind::kShm : CollectivesKind::kGloo;
      why = shared ? "every rank sees this /dev/shm" : "the ranks do not share one /dev/shm";
    }
  } else if (kind == CollectivesKind::kShm && !o.gpu) {
    // Checked, not assumed: ranks that do not share the segment's /dev/shm would only time
    // out waiting for each other.
    TESSERA_ASSIGN_OR_RETURN(const bool shared, cgi::all_share_shm(link, o));
    if (!shared)
      return invalid_argument("worker.collectives shm: the ranks do not share one /dev/shm (other hosts, or pods "
                              "with their own); use gloo, or auto");
    why = "worker.collectives";
  } else {
    why = "worker.collectives";
  }
  if (o.gpu != (kind == CollectivesKind::kNccl))
    return invalid_argument(std::string("worker.collectives ") + collectives_kind_name(kind) + " cannot serve " +
                            (o.gpu ? "GPU ranks (their tensors are in device memory: nccl or auto)"
                                   : "CPU ranks (nccl is for GPUs: auto, shm or gloo)"));
  TESSERA_LOG_INFO("rank {}/{}: collectives over {} ({})", o.rank, o.world_size, collectives_kind_name(kind), why);
  // For the coordinator's /metrics (tessera:collectives_info).
  if (o.rank == 0) TESSERA_RETURN_IF_ERROR(link.publish_collective_blob(std::string("collectives:") + collectives_kind_name(kind)));
  switch (kind) {
    case CollectivesKind::kShm:
      return make_shm_communicator(o.shm_group, o.rank, o.world_size, cgi::kShmSlotBytes, o.timeout_ms);
    case CollectivesKind::kGloo: {
      GlooOptions g;
      g.rank = o.rank;
      g.world_size = o.world_size;
      g.address = o.gloo_address;
      g.interface = o.gloo_interface;
      g.timeout_ms = o.timeout_ms;
      std::unique_ptr<GlooRendezvous> rendezvous = make_link_rendezvous(link);
      return make_gloo_communicator(g, *rendezvous);
    }
    default:
      return cgi::make_nccl(link, o);
  }
}

}  // namespace tessera
