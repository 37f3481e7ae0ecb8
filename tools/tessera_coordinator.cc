// tessera-coordinator: the scheduling process alone. Its workers are started separately
// (`tessera-worker --config FILE --rank R`, on this host or others) and connect to
// server.control; the HTTP API serves once all of them are ready.
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/config.h"
#include "common/crash_report.h"
#include "common/logging.h"
#include "tools/lib/main_guard.h"
#include "tools/lib/serve_runtime.h"

namespace {

int coordinator_main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App app{"tessera-coordinator: scheduler, KV block manager and API of a Tessera deployment"};
  app.add_option("--config", config_path, "YAML configuration (docs/configuration.md)")->required();
  app.add_option("--set", overrides, "override any config key (repeatable)");
  CLI11_PARSE(app, argc, argv);
  tessera::init_logging("coord");
  tessera::install_crash_report("coord");
  auto fail = [](const tessera::Status& st) {
    std::cerr << "tessera-coordinator: " << st.to_string() << std::endl;
    return 1;
  };
  auto config = tessera::load_config_file(config_path);
  if (!config.is_ok()) return fail(config.status());
  for (const std::string& o : overrides) {
    if (tessera::Status st = tessera::apply_override_arg(config.value(), o); !st.is_ok()) return fail(st);
  }
  tessera::ServeOptions options;
  options.config = config.value();
  options.spawn_workers = false;
  tessera::Status st = tessera::serve(options);
  if (!st.is_ok()) return fail(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-coordinator", [&] { return coordinator_main(argc, argv); });
}
