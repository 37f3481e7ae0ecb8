#pragma once
// The flags tessera-serve and tessera-batch share: the configuration file, the model and how
// its workers run, and --set for any key. Each flag is a configuration key's override
// (docs/configuration.md); flags and --set win over the file.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace tessera {

struct ServingFlags {
  std::string config_path, model, host, backend, dtype, quantize, bf16_coding, check_weights;
  int port = -1, tensor_parallel = 0, threads = -1;
  std::vector<std::string> overrides;
};

// Adds the flags to `app`; `http`: also --host and --port.
void add_serving_flags(CLI::App& app, ServingFlags& flags, bool http);

// The configuration the flags name: --config's file, else the bundled demo (models/kjv-llama
// in float32), then `defaults` (key=value, e.g. a command's own scheduler settings), then the
// flags and --set. The internal endpoints not given take free ports on this host.
StatusOr<TesseraConfig> config_from_serving_flags(const ServingFlags& flags, const std::vector<std::string>& defaults = {});

}  // namespace tessera
