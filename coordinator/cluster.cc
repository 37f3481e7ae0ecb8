#include "coordinator/cluster.h"

#include <unistd.h>

#include "common/curve_keys.h"

namespace tessera {

StatusOr<std::unique_ptr<WorkerGroup>> start_cluster(const ClusterOptions& o) {
  WorkerGroupOptions wo;
  wo.bind_address = o.config.server.control;
  wo.world_size = o.config.parallel.tensor_parallel;
  wo.heartbeat_interval = std::chrono::milliseconds(o.config.server.heartbeat_ms);
  // server.curve: the coordinator's keypair and the workers it lets in, from their files.
  TESSERA_ASSIGN_OR_RETURN(CurveServerKeys keys, load_curve_server_keys(o.config.server.curve));
  wo.curve_server_public_key = keys.server.public_key;
  wo.curve_server_secret_key = keys.server.secret_key;
  wo.curve_allowed_client_keys = keys.allowed_client_keys;
  wo.regroup_on_rank_loss = true;  // a collective group cannot take one new member
  const std::string config_yaml = dump_config_yaml(o.config);
  const TesseraConfig c = o.config;
  auto factory = [c, config_yaml, o](int rank, const wire::Register&) {
    wire::Assignment a;
    a.model_path = c.model.path;
    a.dtype = dtype_name(c.model.dtype);
    a.kernel_inject = c.model.kernel_inject;
    a.world_size = c.parallel.tensor_parallel;
    a.rank = rank;
    a.kv_block_size = c.cache.block_size;
    a.kv_num_blocks = o.kv_num_blocks;
    a.kv_dtype = dtype_name(o.kv_dtype);
    a.collective_bootstrap = o.group_name;
    a.tp_plan = config_yaml;
    return a;
  };
  auto group = std::make_unique<WorkerGroup>();
  TESSERA_RETURN_IF_ERROR(group->start(wo, factory));
  return group;
}

}  // namespace tessera
