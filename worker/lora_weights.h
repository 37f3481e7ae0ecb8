#pragma once
// A LoRA adapter laid out as this rank computes with it: for every linear of the base
// (LinearWeights::lora_site), the parts of the adapter that update its outputs. The base's
// layout decides the parts, so an adapter follows whatever the loader did to its layer:
// - a packed QKV or gate|up gets one part per adapted source module (q_proj's rows update
//   the q columns of the packed output, k_proj's the k columns, ...; Phi-3's fused qkv_proj
//   or BLOOM's per-head interleaved query_key_value one part whose B rows are gathered in
//   the packed order);
// - a column-parallel split (this rank's output rows) keeps A whole and B's matching rows;
// - a row-parallel split (this rank's inputs) keeps A's matching columns and B whole: this
//   rank's contribution is a partial sum that joins the base layer's all-reduce, so an
//   adapter adds no collective.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/lora_adapter.h"
#include "worker/model_weights.h"

namespace tessera {

// Output columns [offset, offset + expand.dim(1)) of a linear += scale · (x · shrink) · expand,
// x being this rank's input of the linear: shrink [inputs here, r] (lora_A's columns of this
// rank, transposed), expand [r, outputs here] (lora_B's rows, transposed), on the backend, as
// Backend::lora_add takes them: bfloat16 for a bfloat16 model (half the bytes a step reads,
// as vLLM keeps adapters in the model's dtype), else float32.
struct LoraPart {
  int64_t offset = 0;
  Tensor shrink, expand;
};

struct LoraWeights {
  std::string name;
  std::string path;
  int rank = 0;
  float scale = 1.0f;
  // By LinearWeights::lora_site (an empty entry: that linear is not adapted). `host` holds the
  // parts in host memory as long as the adapter is held; `sites` the same parts placed on the
  // backend (Backend::place_weight: the same tensors on the CPU, device copies on CUDA), which
  // the forward reads, only while the adapter is resident (place_lora .. evict_lora).
  std::vector<std::vector<LoraPart>> host;
  std::vector<std::vector<LoraPart>> sites;
  bool resident = false;
  int64_t bytes = 0;  // of this rank's parts (one copy)
};

// Places the host parts on `backend` (sites); a resident adapter is left as it is.
void place_lora(LoraWeights& adapter, Backend& backend);
// Drops the placed parts (device memory on CUDA); the host parts stay, to be placed again.
void evict_lora(LoraWeights& adapter);

// The adapter's parts for this rank's `weights` (loaded from the same base the adapter was read
// against), in host memory, not yet resident (place_lora).
// `model_dtype`: the model's storage dtype (Transformer::dtype), which decides the factors'.
StatusOr<LoraWeights> shard_lora_adapter(const LoraAdapter& adapter, const std::string& name,
                                         const ModelWeights& weights, DType model_dtype);

// Reads the PEFT folder `dir` against the base model at `model_path` (load_lora_adapter) and
// lays it out for this rank's `weights` of that model, to be served as `name`.
StatusOr<LoraWeights> load_lora_weights(const std::string& name, const std::string& dir, const std::string& model_path,
                                        const ModelWeights& weights, DType model_dtype, int max_rank);

}  // namespace tessera
