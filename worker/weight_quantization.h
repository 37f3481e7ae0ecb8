#pragma once
// Int8 weight-only quantization at load time (docs/quantization.md): which linear weights of
// one rank's loaded shard become int8, and the conversion, slice by slice, so a rank never
// holds more than its own share. Also the refusal of checkpoints that are already quantized
// in a format Tessera does not compute (GPTQ, AWQ, bitsandbytes ...).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "common/checkpoint.h"
#include "common/gguf/gguf_file.h"
#include "common/quantization.h"
#include "common/status.h"
#include "common/tensor_arena.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/tp_plan.h"

namespace tessera {

// A checkpoint whose config.json carries `quantization_config`, or whose tensors are a
// quantized format's (`*.qweight`, `*.qzeros`, `*.scales`, `*.g_idx`, `*.SCB`, ...), is
// refused with one line naming what was found.
Status check_not_prequantized(const Checkpoint& checkpoint);

// The panel scheme (kernels/int4_layout.h) that holds a ggml block type value for value:
// q4_0, q4_1, q4_K and (under auto only: `int4` asks for 4 bits) q5_0, q5_1, q5_K, q6_K;
// nullopt for the others.
std::optional<Int4Scheme> panel_scheme_of_blocks(GgmlType type, bool auto_kind);
// Whether the loader keeps a matrix of this type as blocks for quantize_model_weights: the
// panel types above, and under auto q8_0 (stored as int8 with the blocks' own scales).
bool kept_as_blocks(GgmlType type, bool auto_kind);
// Bytes per weight of a matrix in `scheme`'s panels, scales included (q4_0-style 4.5 bits ...
// q6_K-style 6.5625).
double panel_bytes_per_weight(Int4Scheme scheme);

// model.quantization auto made definite for `checkpoint`: for a GGUF file with a matrix
// stored in quantized blocks, int8 with keep_blocks set when some are of a type
// panel_scheme_of_blocks takes
// (logged once, naming the block types); none otherwise. Other kinds are returned as they are.
QuantizationOptions resolve_quantization(const QuantizationOptions& options, const Checkpoint& checkpoint);

// Quantizes, in place, every linear weight of `weights` that `options` (resolved as above)
// selects, to options.kind (int8 or int4):
//  - by default the column- and row-parallel linears of the TP plan (attention, MLPs, every
//    expert and the shared expert), and under int4 an untied LM head, as int8; embeddings,
//    norms, routers, gates kept whole and (under int8) the LM head stay in the compute dtype
//    (plan == nullptr: the built-in policy, the same split);
//  - options.rules (the first regex found in a weight's checkpoint name decides: int8, int4
//    or none) override that, except that a tensor the plan keeps whole, the embedding and a
//    tied LM head are never quantized, and a rule that matches no linear weight is an error.
// A matrix the loader kept as ggml blocks (LinearWeights::ggml_blocks) becomes panels of as
// many bits value for value when it is to be quantized (int4, or int8 with keep_blocks), a
// q8_0 one int8 with its own values and scales (groups of 32), and is decoded to `dtype`
// otherwise. A packed matrix (fused QKV, gate|up) is quantized
// only if all its sources are. Errors name the tensor: a group that does not divide this
// rank's input dimension. int8 is stored in `layout` (Int8WeightLayout,
// worker/model_weights.h), 4-bit weights in the one layout every backend reads. Returns the
// change in weight bytes.
StatusOr<int64_t> quantize_model_weights(ModelWeights& weights, const ModelConfig& config,
                                         const Checkpoint& checkpoint, const QuantizationOptions& options,
                                         const TpPlan* plan, Int8WeightLayout layout = Int8WeightLayout::kRows,
                                         DType dtype = DType::kF32);

// A checkpoint's weights as loaded, estimated before loading (the KV pool's sizing, the
// weights' memory budget): every parameter in `dtype`, or where the matrices become quantized
// (model.quantization int8 or int4, or auto on a GGUF file of quantized blocks) the matrices
// but the embedding at a byte each and a float scale per 32 (int8, and int4's LM head), or in
// their panels' bytes (4-bit; 6-bit for auto's q6_K); under int8 the LM head stays in `dtype`,
// under auto only an LM head stored in blocks is quantized.
double estimated_weight_bytes(const Checkpoint& checkpoint, const ModelConfig& config,
                              const QuantizationOptions& options, DType dtype);

namespace quantization_internal {
class QuantSelector;
struct QuantCandidate;
}  // namespace quantization_internal

// quantize_model_weights a layer at a time, as the loader loads them (so that a layer can be
// moved to the weights' spill file already quantized: worker/weight_residency.h), then the
// rest: the same choices and errors, the rules checked once at the end.
class WeightQuantizer {
 public:
  WeightQuantizer(const ModelConfig& config, const Checkpoint& checkpoint, const QuantizationOptions& options,
                  const TpPlan* plan, Int8WeightLayout layout, DType dtype);
  ~WeightQuantizer();
  WeightQuantizer(const WeightQuantizer&) = delete;
  WeightQuantizer& operator=(const WeightQuantizer&) = delete;

  // An invalid model.quantization_group (checked before any weight is touched).
  Status validity() const;
  // Layer `layer` of `weights`, in its final form (once per layer).
  Status quantize_layer(ModelWeights& weights, int layer);
  // Layer `layer` came already in its final form (a cache file read back): only the rules
  // are matched against it, so a rule that only its linears match is not called unused.
  Status restored_layer(ModelWeights& weights, int layer);
  // The layers not done yet and the LM head; the rules' checks. The change in weight bytes
  // over every call.
  StatusOr<int64_t> finish(ModelWeights& weights);

 private:
  Status quantize(std::vector<quantization_internal::QuantCandidate>& list);
  // Codes l as bf16 (kernels/coded_bf16.h) where model.bf16_coding is on and it can be.
  bool code_bf16(LinearWeights& l, TensorArena& arena) const;
  // Tallies what `cand` became ("int8", "4-bit", "6-bit", or its dtype when left as it was).
  void count(const quantization_internal::QuantCandidate& cand, const std::string& made);

  const ModelConfig& config_;
  const Checkpoint& checkpoint_;
  const QuantizationOptions options_;  // resolved
  const Int8WeightLayout layout_;
  const DType dtype_;
  std::unique_ptr<quantization_internal::QuantSelector> selector_;
  std::vector<bool> done_;  // per layer
  int64_t delta_ = 0;
  std::map<std::string, int> made_counts_;  // what the layers' matrices became, for finish()'s log
  std::string lm_head_made_;                // and the LM head
  bool narrow_warned_ = false;              // a decoded matrix too narrow for int8 was logged
  int restored_layers_ = 0;
};

}  // namespace tessera
