#pragma once
// The weight-streaming flags tessera-generate and tessera-bench share (--weights-budget,
// --weights-spill-dir, --weights-cache-dir, --weights-prefetch-layers, --weights-streaming; model.weights_* in a
// configuration) into the loader's options; an error names the flag that is wrong.
#include <string>

#include "common/status.h"
#include "worker/weight_residency.h"

namespace CLI {
class App;
}

namespace tessera {

struct WeightStreamingFlags {
  std::string budget = "all";
  std::string spill_dir;
  std::string cache_dir;
  int prefetch_layers = 2;
  std::string streaming = "read";
};

// Adds the flags to `app`, bound to `flags`.
void add_weight_streaming_flags(CLI::App& app, WeightStreamingFlags& flags);
StatusOr<WeightResidencyOptions> weight_residency_from_flags(const WeightStreamingFlags& flags);

}  // namespace tessera
