// tessera-serve: the coordinator and its local workers in one command. With no config it
// serves the bundled default model (models/kjv-llama) on 127.0.0.1:8000.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>

#include "common/config.h"
#include "common/logging.h"
#include "coordinator/local_workers.h"
#include "tools/lib/serve_runtime.h"

namespace {

// models/kjv-llama from the working directory, else from the source tree this binary was
// built in (build/bin/../../models).
std::string default_model() {
  namespace fs = std::filesystem;
  for (const fs::path& p : {fs::path("models/kjv-llama"),
                            fs::path(tessera::executable_dir()) / ".." / ".." / "models" / "kjv-llama"}) {
    if (fs::exists(p / "config.json")) return p.lexically_normal().string();
  }
  return "models/kjv-llama";
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, model, host, backend;
  int port = -1, tensor_parallel = 0;
  std::vector<std::string> overrides;
  CLI::App app{"tessera-serve: OpenAI-compatible server with its local tensor-parallel workers"};
  app.add_option("--config", config_path, "YAML configuration (docs/configuration.md)");
  app.add_option("--model", model, "model folder or DeepSpeed checkpoint JSON (default: models/kjv-llama)");
  app.add_option("--host", host, "HTTP host (server.http.host)");
  app.add_option("--port", port, "HTTP port (server.http.port)");
  app.add_option("--tensor-parallel", tensor_parallel, "worker processes (parallel.tensor_parallel)");
  app.add_option("--backend", backend, "cpu or cuda (worker.backend)");
  app.add_option("--set", overrides, "override any config key: --set scheduler.max_num_seqs=64 (repeatable)");
  CLI11_PARSE(app, argc, argv);
  tessera::init_logging("coord");

  auto fail = [](const tessera::Status& st) {
    std::cerr << "tessera-serve: " << st.to_string() << std::endl;
    return 1;
  };
  tessera::TesseraConfig config;
  if (!config_path.empty()) {
    auto loaded = tessera::load_config_file(config_path);
    if (!loaded.is_ok()) return fail(loaded.status());
    config = std::move(loaded).value();
  } else {
    // The bundled demo: a small model that a CPU serves exactly in float32.
    config.model.path = default_model();
    config.model.dtype = tessera::DType::kF32;
  }
  std::vector<std::string> flags = overrides;
  if (!model.empty()) flags.push_back("model.path=" + model);
  if (!host.empty()) flags.push_back("server.http.host=" + host);
  if (port >= 0) flags.push_back("server.http.port=" + std::to_string(port));
  if (tensor_parallel > 0) flags.push_back("parallel.tensor_parallel=" + std::to_string(tensor_parallel));
  if (!backend.empty()) flags.push_back("worker.backend=" + backend);
  for (const std::string& f : flags) {
    if (tessera::Status st = tessera::apply_override_arg(config, f); !st.is_ok()) return fail(st);
  }
  tessera::ServeOptions options;
  options.config = config;
  options.spawn_workers = true;
  tessera::Status st = tessera::serve(options);
  if (!st.is_ok()) return fail(st);
  return 0;
}
