#include "coordinator/cluster.h"

#include <unistd.h>

namespace tessera {

StatusOr<std::unique_ptr<WorkerGroup>> start_cluster(const ClusterOptions& o) {
  WorkerGroupOptions wo;
  wo.bind_address = o.config.server.control;
  wo.world_size = o.config.parallel.tensor_parallel;
  wo.heartbeat_interval = std::chrono::milliseconds(o.config.server.heartbeat_ms);
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
