#include "tools/lib/serving_flags.h"

#include <filesystem>

#include "common/quantization_flags.h"
#include "coordinator/cluster/local_workers.h"
#include "tools/lib/local_endpoints.h"

namespace tessera {

namespace {

// models/kjv-llama from the working directory, else from the source tree this binary was
// built in (build/bin/../../models).
std::string default_model() {
  namespace fs = std::filesystem;
  for (const fs::path& p : {fs::path("models/kjv-llama"), fs::path(executable_dir()) / ".." / ".." / "models" / "kjv-llama"}) {
    if (fs::exists(p / "config.json")) return p.lexically_normal().string();
  }
  return "models/kjv-llama";
}

}  // namespace

void add_serving_flags(CLI::App& app, ServingFlags& f, bool http) {
  // Defaults are the configuration's (docs/configuration.md); without --config the bundled
  // demo: models/kjv-llama in float32.
  app.add_option("--config", f.config_path, "YAML configuration (docs/configuration.md) (default: none, the bundled demo)");
  app.add_option("--model", f.model,
                 "model folder, DeepSpeed checkpoint JSON or GGUF file (model.path) (default: models/kjv-llama without --config)");
  app.add_option("--dtype", f.dtype,
                 "weight type: float32, float16 or bfloat16 (model.dtype) (default: float16; float32 without --config)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--quantize", f.quantize,
                 std::string(kQuantizeFlagHelp) + " (model.quantization; docs/quantization.md) (default: auto)")
      ->check(CLI::IsMember({"auto", "none", "int8", "int4"}));
  app.add_option("--bf16-coding", f.bf16_coding, std::string(kBf16CodingFlagHelp) + " (default: auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--check-weights", f.check_weights,
                 "refuse NaN/Inf weights at load, naming the tensor: auto (checkpoints up to 8 GiB), true or false "
                 "(model.check_weights) (default: auto)")
      ->check(CLI::IsMember({"auto", "true", "false"}));
  if (http) {
    app.add_option("--host", f.host, "HTTP host (server.http.host) (default: 127.0.0.1)");
    app.add_option("--port", f.port, "HTTP port, 0 = any free port (server.http.port) (default: 8000)")
        ->check(CLI::Range(0, 65535));
  }
  app.add_option("--tensor-parallel", f.tensor_parallel, "worker processes (parallel.tensor_parallel) (default: 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--backend", f.backend, "auto, cpu or cuda (worker.backend) (default: auto: CUDA when there is a GPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--threads", f.threads,
                 "CPU threads per worker, 0 = one per core of its share of this host's cores (worker.threads) (default: 0)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--set", f.overrides, "override any config key: --set scheduler.max_num_seqs=64 (repeatable)");
  app.footer("A flag's default is the configuration's (--config, else the defaults above); flags and --set win over "
             "the file.");
}

StatusOr<TesseraConfig> config_from_serving_flags(const ServingFlags& f, const std::vector<std::string>& defaults) {
  TesseraConfig config;
  if (!f.config_path.empty()) {
    TESSERA_ASSIGN_OR_RETURN(config, load_config_file(f.config_path));
  } else {
    // The bundled demo: a small model that a CPU serves exactly in float32.
    config.model.path = default_model();
    config.model.dtype = DType::kF32;
  }
  std::vector<std::string> flags = defaults;
  flags.insert(flags.end(), f.overrides.begin(), f.overrides.end());
  if (!f.model.empty()) flags.push_back("model.path=" + f.model);
  if (!f.dtype.empty()) flags.push_back("model.dtype=" + f.dtype);
  if (!f.quantize.empty()) flags.push_back("model.quantization=" + f.quantize);
  if (!f.bf16_coding.empty()) flags.push_back("model.bf16_coding=" + f.bf16_coding);
  if (!f.check_weights.empty()) flags.push_back("model.check_weights=" + f.check_weights);
  if (f.threads >= 0) flags.push_back("worker.threads=" + std::to_string(f.threads));
  if (!f.host.empty()) flags.push_back("server.http.host=" + f.host);
  if (f.port >= 0) flags.push_back("server.http.port=" + std::to_string(f.port));
  if (f.tensor_parallel > 0) flags.push_back("parallel.tensor_parallel=" + std::to_string(f.tensor_parallel));
  if (!f.backend.empty()) flags.push_back("worker.backend=" + f.backend);
  for (const std::string& flag : flags) TESSERA_RETURN_IF_ERROR(apply_override_arg(config, flag));
  // Its own workers on this host: the internal endpoints not given take free ports, so
  // several servers share a host (tools/lib/serve_runtime.h logs which were chosen).
  choose_free_local_endpoints(config);
  return config;
}

}  // namespace tessera
