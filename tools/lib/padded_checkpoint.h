#pragma once
// A padded copy of a trained model (tessera-make-checkpoint --pad-from): extra decoder
// layers whose attention output and MLP down projections are zero, so each adds exactly
// nothing to the residual stream, and a wider MLP whose extra units feed zero columns of the
// down projection. The copy computes the original's logits (to float rounding) at any size
// asked for — a target of realistic cost whose true draft is the original, for measuring
// speculative decoding. Dense models with separate gate / up / down projections and the same
// attention in every layer (Llama, Mistral, Qwen2/3, ...); anything else is refused by name.
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/status.h"

namespace tessera {

struct PaddingOptions {
  std::string from;  // the trained model (any checkpoint Tessera reads)
  std::string out;   // folder written: config.json, model.safetensors, the source's other files
  int64_t layers = 0;  // decoder layers of the copy (>= the source's)
  int64_t ffn = 0;     // MLP width of the copy (>= the source's)
  DType dtype = DType::kF32;
  uint64_t seed = 0;  // of the extra units' and layers' random (but inert) weights
};

Status write_padded_copy(const PaddingOptions& options);

}  // namespace tessera
