#pragma once
// A DeepSpeed checkpoint JSON, in the forms DeepSpeed's own loaders read
// (deepspeed/module_inject/replace_module.py, deepspeed/runtime/state_dict_factory.py):
//   {"type": "BLOOM-176B", "checkpoints": ["a.bin", "b.bin"], "version": 1.0}
// optionally with "base_dir" (the files' folder; relative to the JSON's folder unless
// absolute), "parallelization" ("pp", the default: every file holds whole tensors),
// "tp_size"/"mp_size" and "dtype". The pre-sharded form DeepSpeed writes with
// save_mp_checkpoint_path ({"non_tp": [...], "tp": [...]}, "parallelization": "tp") is
// checked for consistency (the tp list holds tp_size files per partition); its files are
// read like the others, and the Checkpoint refuses them when two tp files hold the same
// tensor name: then they are DeepSpeed's per-rank cut, not whole Hugging Face tensors.
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct DeepSpeedCheckpoint {
  std::string type;                // "BLOOM-176B" as written
  std::vector<std::string> files;  // resolved paths, in the JSON's order, without repeats
  std::vector<std::string> tp_files;  // "checkpoints"."tp", resolved likewise
  std::string base_dir;            // where the files are (config.json is looked for here first)
};

// Errors name the JSON file and the field.
StatusOr<DeepSpeedCheckpoint> read_deepspeed_json(const std::string& path);

}  // namespace tessera
