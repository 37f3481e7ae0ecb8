#pragma once
// A random LoRA adapter for any model Tessera serves (tessera-make-checkpoint --lora-of), written
// as PEFT writes one: adapter_config.json and adapter_model.safetensors with
// base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight [out, r] for every linear
// layer of the base's blocks that target_modules names (worker/lora_adapter.h). Unlike PEFT's
// initialisation B is not zero, so the adapter changes the logits (for tests and benchmarks).
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace tessera {

struct RandomLoraOptions {
  std::string base;  // the base model (a folder or checkpoint Tessera reads)
  std::string out;   // folder written (created if missing)
  int rank = 8;
  double alpha = 16;
  bool rslora = false;
  // Module names (PEFT's suffix match), or {"all-linear"}.
  std::vector<std::string> targets{"all-linear"};
  DType dtype = DType::kF32;  // of the factors as stored
  uint64_t seed = 0;
  // Scale of the factors' entries (uniform in [-s, s]); B's makes the update visible.
  float a_scale = 0.1f, b_scale = 0.02f;
};

// Errors name the option: a base that does not load, targets that name no module of it.
Status write_random_lora(const RandomLoraOptions& options);

}  // namespace tessera
