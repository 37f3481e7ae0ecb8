// tessera-worker: one tensor-parallel rank. Connects to the coordinator named by the
// config (server.control), loads its shard of the model and executes steps until told to
// stop. `--print-tp-plan` prints how the config splits the model and exits. In a pod the
// rank, world size and coordinator address may come from the environment (StatefulSet
// ordinal, LeaderWorkerSet variables; worker/pod_identity.h).
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/config.h"
#include "common/crash_report.h"
#include "common/logging.h"
#include "tools/lib/main_guard.h"
#include "worker/pod_identity.h"
#include "worker/worker_runtime.h"

namespace {

int worker_main(int argc, char** argv) {
  std::string config_path;
  std::string rank_flag;  // "" = not given
  std::vector<std::string> overrides;
  bool print_plan = false;
  CLI::App app{"tessera-worker: one tensor-parallel rank of a Tessera deployment"};
  app.add_option("--config", config_path, "YAML configuration (see docs/configuration.md)")->required();
  app.add_option("--rank", rank_flag,
                 "this worker's tensor-parallel rank (0-based), or 'auto': TESSERA_RANK, LWS_WORKER_INDEX, "
                 "else the hostname's StatefulSet ordinal (the default, falling back to 0)");
  app.add_option("--set", overrides, "override a config key: --set parallel.tensor_parallel=2 (repeatable)");
  app.add_flag("--print-tp-plan", print_plan, "print the tensor-parallel plan as a table and exit");
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const tessera::Status& st) {
    std::cerr << "tessera-worker: " << st.to_string() << std::endl;
    return 1;
  };
  auto config = tessera::load_config_file(config_path);
  if (!config.is_ok()) return fail(config.status());
  for (const std::string& o : overrides) {
    tessera::Status st = tessera::apply_override_arg(config.value(), o);
    if (!st.is_ok()) return fail(st);
  }
  if (tessera::Status st = tessera::validate_config(config.value()); !st.is_ok()) return fail(st);
  if (print_plan) {
    auto table = tessera::describe_tp_plan(config.value());
    if (!table.is_ok()) return fail(table.status());
    std::cout << table.value();
    return 0;
  }
  auto identity = tessera::resolve_worker_identity(rank_flag, config.value(), tessera::current_pod_environment());
  if (!identity.is_ok()) return fail(identity.status());
  const int rank = identity->rank;
  config.value().worker.control_address = identity->control_address;
  tessera::init_logging("w" + std::to_string(rank));
  tessera::install_crash_report("w" + std::to_string(rank));
  TESSERA_LOG_INFO("rank {} of {} (from {}); coordinator at {} (from {})", rank, identity->world_size,
                   identity->rank_source, identity->control_address, identity->address_source);
  tessera::Status st = tessera::run_worker(config.value(), rank);
  if (!st.is_ok()) return fail(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-worker", [&] { return worker_main(argc, argv); });
}
