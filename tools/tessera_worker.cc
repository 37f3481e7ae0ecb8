// tessera-worker: one tensor-parallel rank. Connects to the coordinator named by the
// config (server.control), loads its shard of the model and executes steps until told to
// stop. `--print-tp-plan` prints how the config splits the model and exits.
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/config.h"
#include "common/logging.h"
#include "worker/worker_runtime.h"

int main(int argc, char** argv) {
  std::string config_path;
  int rank = 0;
  std::vector<std::string> overrides;
  bool print_plan = false;
  CLI::App app{"tessera-worker: one tensor-parallel rank of a Tessera deployment"};
  app.add_option("--config", config_path, "YAML configuration (see docs/configuration.md)")->required();
  app.add_option("--rank", rank, "this worker's tensor-parallel rank (0-based)");
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
  if (rank < 0 || rank >= config.value().parallel.tensor_parallel) {
    return fail(tessera::invalid_argument("--rank " + std::to_string(rank) + " outside parallel.tensor_parallel = " +
                                          std::to_string(config.value().parallel.tensor_parallel)));
  }
  tessera::init_logging("w" + std::to_string(rank));
  tessera::Status st = tessera::run_worker(config.value(), rank);
  if (!st.is_ok()) return fail(st);
  return 0;
}
