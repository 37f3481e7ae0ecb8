// tessera-serve: the coordinator and its local workers in one command. With no config it
// serves the bundled default model (models/kjv-llama) on 127.0.0.1:8000.
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/crash_report.h"
#include "common/logging.h"
#include "tools/lib/main_guard.h"
#include "tools/lib/serve_runtime.h"
#include "tools/lib/serving_flags.h"

namespace {

int serve_main(int argc, char** argv) {
  tessera::ServingFlags flags;
  CLI::App app{"tessera-serve: OpenAI-compatible server with its local tensor-parallel workers"};
  tessera::add_serving_flags(app, flags, /*http=*/true);
  CLI11_PARSE(app, argc, argv);
  tessera::init_logging("coord");
  tessera::install_crash_report("coord");

  auto fail = [](const tessera::Status& st) {
    std::cerr << "tessera-serve: " << st.to_string() << std::endl;
    return 1;
  };
  tessera::StatusOr<tessera::TesseraConfig> config = tessera::config_from_serving_flags(flags);
  if (!config.is_ok()) return fail(config.status());
  tessera::ServeOptions options;
  options.config = std::move(config).value();
  options.spawn_workers = true;
  tessera::Status st = tessera::serve(options);
  if (!st.is_ok()) return fail(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-serve", [&] { return serve_main(argc, argv); });
}
