#include "tools/lib/weight_streaming_flags.h"

#include <CLI/CLI.hpp>

#include "common/weights_budget.h"

namespace tessera {

void add_weight_streaming_flags(CLI::App& app, WeightStreamingFlags& flags) {
  app.add_option("--weights-budget", flags.budget,
                 "bytes of weights each rank keeps resident (all, a byte count such as 6GiB, or a share such as 25%); "
                 "the rest is streamed: on the CPU from the checkpoint where it holds them as computed, else from a "
                 "spill file, on CUDA from pinned host memory into device buffers (model.weights_memory_budget)")
      ->capture_default_str();
  app.add_option("--weights-spill-dir", flags.spill_dir,
                 "folder for the streamed weights' spill file, taking every streamed unit (default: $TMPDIR, else "
                 "/var/tmp, and the units the checkpoint holds as computed are streamed from it)");
  app.add_option("--weights-cache-dir", flags.cache_dir,
                 "folder that keeps the streamed weights for the next start: the first writes a cache file per "
                 "model, rank and options, later ones read it back instead of loading those layers "
                 "(model.weights_cache_dir, instead of --weights-spill-dir; default: none, a spill file)");
  app.add_option("--weights-prefetch-layers", flags.prefetch_layers,
                 "streamed units in flight: the one running and those read ahead (model.weights_prefetch_layers)")
      ->capture_default_str();
  app.add_option("--weights-streaming", flags.streaming,
                 "how a streamed unit is brought in from the checkpoint or the spill file: map (madvise on the "
                 "mapped file), read (pread into the process's memory) or direct (pread with O_DIRECT) "
                 "(model.weights_streaming)")
      ->capture_default_str();
}

StatusOr<WeightResidencyOptions> weight_residency_from_flags(const WeightStreamingFlags& flags) {
  StatusOr<WeightsBudget> budget = parse_weights_budget(flags.budget);
  if (!budget.is_ok()) return invalid_argument("--weights-budget: " + budget.status().message());
  if (flags.prefetch_layers < 1 || flags.prefetch_layers > 64)
    return invalid_argument("--weights-prefetch-layers: expected 1 to 64, got " + std::to_string(flags.prefetch_layers));
  StatusOr<WeightStreaming> streaming = parse_weight_streaming(flags.streaming);
  if (!streaming.is_ok()) return invalid_argument("--weights-streaming: " + streaming.status().message());
  WeightResidencyOptions o;
  o.budget = *budget;
  o.spill_dir = flags.spill_dir;
  o.cache_dir = flags.cache_dir;
  o.prefetch_layers = flags.prefetch_layers;
  o.streaming = *streaming;
  return o;
}

}  // namespace tessera
