#include "coordinator/cluster/cluster.h"

#include <unistd.h>

#include "common/zmq/curve_keys.h"
#include "common/logging.h"

namespace tessera {

std::string worker_config_yaml(const TesseraConfig& config) {
  TesseraConfig c = config;
  c.server.http.api_keys.clear();
  c.server.http.api_keys_file.clear();  // a path, not a key, but the workers have no use for it
  return dump_config_yaml(c);
}

StatusOr<Cluster> start_cluster(const ClusterOptions& o) {
  WorkerGroupOptions wo;
  wo.bind_address = o.config.server.control;
  wo.world_size = o.config.parallel.tensor_parallel;
  wo.heartbeat_interval = std::chrono::milliseconds(o.config.server.heartbeat_ms);
  wo.heartbeat_misses = o.config.server.heartbeat_misses;  // as the workers count them
  // server.curve: the coordinator's keypair and the workers it lets in, from their files.
  TESSERA_ASSIGN_OR_RETURN(CurveServerKeys keys, load_curve_server_keys(o.config.server.curve));
  wo.curve_server_public_key = keys.server.public_key;
  wo.curve_server_secret_key = keys.server.secret_key;
  wo.curve_allowed_client_keys = keys.allowed_client_keys;
  wo.regroup_on_rank_loss = true;  // a collective group cannot take one new member

  auto pool = std::make_shared<KvPoolSetting>();
  const bool auto_pool = !o.config.cache.num_blocks.has_value();
  if (!auto_pool) {
    if (*o.config.cache.num_blocks > INT32_MAX) {
      return invalid_argument("cache.num_blocks " + std::to_string(*o.config.cache.num_blocks) +
                              " exceeds the 2^31 - 1 blocks the wire protocol addresses");
    }
    pool->set(KvPoolSize{*o.config.cache.num_blocks, o.config.cache.block_size, "cache.num_blocks"});
  } else {
    const size_t world = static_cast<size_t>(wo.world_size);
    if (o.kv_model.bytes_per_block.size() != world || o.kv_model.weight_bytes.size() != world) {
      return internal_error("cache.num_blocks auto needs the model's KV bytes per block and weights for each of the " +
                            std::to_string(world) + " ranks");
    }
    const CacheSection cache = o.config.cache;
    const KvPoolModel model = o.kv_model;
    wo.on_all_registered = [pool, cache, model](const std::vector<wire::Register>& ranks) -> Status {
      TESSERA_ASSIGN_OR_RETURN(KvPoolSize size, size_kv_pool(cache, model, ranks));
      TESSERA_LOG_INFO("{}", size.describe());
      pool->set(std::move(size));
      return Status::ok();
    };
  }

  const std::string config_yaml = worker_config_yaml(o.config);
  const TesseraConfig c = o.config;
  auto factory = [c, config_yaml, o, pool, auto_pool](int rank,
                                                      const wire::Register& reg) -> StatusOr<wire::Assignment> {
    // The configuration names a backend: a worker that made another one is refused.
    if (c.worker.backend && reg.backend != backend_kind_name(*c.worker.backend)) {
      return invalid_argument("rank " + std::to_string(rank) + " registered with backend '" + reg.backend +
                              "' but worker.backend is " + backend_kind_name(*c.worker.backend));
    }
    const std::optional<KvPoolSize> size = pool->get();
    if (!size) return internal_error("rank " + std::to_string(rank) + " to be assigned before the KV pool was sized");
    if (auto_pool) TESSERA_RETURN_IF_ERROR(check_rank_fits_kv_pool(c.cache, o.kv_model, *size, reg));
    wire::Assignment a;
    a.model_path = c.model.path;
    a.dtype = dtype_name(c.model.dtype);
    a.kernel_inject = c.model.kernel_inject;
    a.world_size = c.parallel.tensor_parallel;
    a.rank = rank;
    a.kv_block_size = c.cache.block_size;
    a.kv_num_blocks = static_cast<int32_t>(size->num_blocks);
    a.kv_dtype = dtype_name(o.kv_dtype);
    a.collective_bootstrap = o.group_name;
    a.worker_config_yaml = config_yaml;
    return a;
  };
  Cluster cluster;
  cluster.group = std::make_unique<WorkerGroup>();
  cluster.kv_pool = pool;
  TESSERA_RETURN_IF_ERROR(cluster.group->start(wo, factory));
  return cluster;
}

}  // namespace tessera
