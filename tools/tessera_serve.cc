// tessera-serve: the coordinator and its local workers in one command. With no config it
// serves the bundled default model (models/kjv-llama) on 127.0.0.1:8000.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>

#include "common/config.h"
#include "common/crash_report.h"
#include "common/logging.h"
#include "coordinator/cluster/local_workers.h"
#include "tools/lib/local_endpoints.h"
#include "tools/lib/main_guard.h"
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

namespace {

int serve_main(int argc, char** argv) {
  std::string config_path, model, host, backend, dtype, quantize, check_weights;
  int port = -1, tensor_parallel = 0, threads = -1;
  std::vector<std::string> overrides;
  CLI::App app{"tessera-serve: OpenAI-compatible server with its local tensor-parallel workers"};
  // Defaults are the configuration's (docs/configuration.md); without --config the bundled
  // demo: models/kjv-llama in float32.
  app.add_option("--config", config_path, "YAML configuration (docs/configuration.md) (default: none, the bundled demo)");
  app.add_option("--model", model,
                 "model folder, DeepSpeed checkpoint JSON or GGUF file (model.path) (default: models/kjv-llama without --config)");
  app.add_option("--dtype", dtype,
                 "weight type: float32, float16 or bfloat16 (model.dtype) (default: float16; float32 without --config)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--quantize", quantize,
                 "weight quantization: auto (for a GGUF file with quantized matrices: its q4_0/q4_K ones 4-bit, the others int8; else none), none, int8 or int4 "
                 "(model.quantization; docs/quantization.md) (default: auto)")
      ->check(CLI::IsMember({"auto", "none", "int8", "int4"}));
  app.add_option("--check-weights", check_weights,
                 "refuse NaN/Inf weights at load, naming the tensor: auto (checkpoints up to 8 GiB), true or false "
                 "(model.check_weights) (default: auto)")
      ->check(CLI::IsMember({"auto", "true", "false"}));
  app.add_option("--host", host, "HTTP host (server.http.host) (default: 127.0.0.1)");
  app.add_option("--port", port, "HTTP port, 0 = any free port (server.http.port) (default: 8000)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--tensor-parallel", tensor_parallel, "worker processes (parallel.tensor_parallel) (default: 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--backend", backend, "auto, cpu or cuda (worker.backend) (default: auto: CUDA when there is a GPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--threads", threads,
                 "CPU threads per worker, 0 = one per core of its share of this host's cores (worker.threads) (default: 0)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--set", overrides, "override any config key: --set scheduler.max_num_seqs=64 (repeatable)");
  app.footer("A flag's default is the configuration's (--config, else the defaults above); flags and --set win over "
             "the file.");
  CLI11_PARSE(app, argc, argv);
  tessera::init_logging("coord");
  tessera::install_crash_report("coord");

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
  if (!dtype.empty()) flags.push_back("model.dtype=" + dtype);
  if (!quantize.empty()) flags.push_back("model.quantization=" + quantize);
  if (!check_weights.empty()) flags.push_back("model.check_weights=" + check_weights);
  if (threads >= 0) flags.push_back("worker.threads=" + std::to_string(threads));
  if (!host.empty()) flags.push_back("server.http.host=" + host);
  if (port >= 0) flags.push_back("server.http.port=" + std::to_string(port));
  if (tensor_parallel > 0) flags.push_back("parallel.tensor_parallel=" + std::to_string(tensor_parallel));
  if (!backend.empty()) flags.push_back("worker.backend=" + backend);
  for (const std::string& f : flags) {
    if (tessera::Status st = tessera::apply_override_arg(config, f); !st.is_ok()) return fail(st);
  }
  // Its own workers on this host: the internal endpoints not given take free ports, so
  // several servers share a host (tools/lib/serve_runtime.h logs which were chosen).
  tessera::choose_free_local_endpoints(config);
  tessera::ServeOptions options;
  options.config = config;
  options.spawn_workers = true;
  tessera::Status st = tessera::serve(options);
  if (!st.is_ok()) return fail(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-serve", [&] { return serve_main(argc, argv); });
}
