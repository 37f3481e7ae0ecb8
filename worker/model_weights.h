#pragma once
// The weights of one model (one tensor-parallel rank), laid out for the transformer block:
// packed QKV and gate|up matrices on the fused ("kernel_inject") path, separate matrices
// on the plain path. Whatever the checkpoint's QKV layout (separate, concatenated, grouped
// per KV head; GPT-2's transposed Conv1D), this rank's rows are gathered into
// [q heads | k heads | v heads] at load so both paths read one layout.
#include <functional>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/quantization.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/coded_bf16_layout.h"
#include "worker/model_config.h"
#include "worker/tp_plan.h"

namespace tessera {

// Where a linear layer's rows came from, for what is applied on top of it (LoRA adapters:
// worker/lora_weights.h): the rows of the checkpoint's weights stacked into its outputs, in
// order (a packed QKV: this rank's q, k and v rows, wherever the checkpoint keeps them), and
// the inputs this rank holds (a row-parallel split).
struct LinearSource {
  struct Rows {
    std::string weight;  // the checkpoint's name, "model.layers.0.self_attn.q_proj.weight"
    int64_t begin = 0, count = 0;
  };
  std::vector<Rows> rows;
  int64_t in_begin = 0, in_count = -1;  // -1: every input
};

struct LinearWeights {
  Tensor w;  // [out, in]: the compute dtype, or int8 (docs/quantization.md), or int8 panels
  Tensor b;  // [out] or empty
  // Coded bf16 w (u8 body [out, coded_bf16_row_bytes(in)], kernels/coded_bf16_layout.h): its
  // side tensor (i32 tables and escapes).
  Tensor scales;  // int8 w only: f32 [out, in / group], or the panels' [ceil(out / 32), in / group, 32];
                  // 4-bit w (u8 nibble panels, kernels/int4_layout.h): f16 or u8 records
  // Load time only: w holds this rank's rows of a GGUF matrix as ggml blocks of this type
  // (u8 [out, bytes per row]; q4_0 or q4_K), kept for quantize_model_weights to pack as
  // 4-bit panels value for value. -1 once loaded (every other weight).
  int32_t ggml_blocks = -1;
  // The layers' linears only (not the router or the LM head): numbered 0.. across the model
  // (ModelWeights::lora_sites), and where their rows came from.
  int32_t lora_site = -1;
  LinearSource source;
};

// How int8 weights are stored: row-major [out, in] with scales [out, groups] (every
// backend), or the CPU's load-time column panels (kernels/cpu/linear_int8_panels.h: w
// [ceil(out / 32), in / 2, 64], scales [ceil(out / 32), groups, 32]), which its AVX-512 VNNI
// kernels read in place instead of repacking rows on every call.
enum class Int8WeightLayout { kRows, kCpuPanels };

// The input width of a linear layer, in any layout (int8 panels hold 2 inputs per byte
// pair step, 4-bit panels 4 per 64-byte step).
inline int64_t linear_in_features(const LinearWeights& l) {
  if (is_coded_bf16(l.w.view(), l.scales.view())) return coded_bf16_inputs(l.w.dim(1));
  if (l.w.view().ndim != 3) return l.w.dim(1);
  return l.w.dtype() == DType::kU8 ? l.w.dim(1) * 4 : l.w.dim(1) * 2;
}

// One MLP: a dense layer's, one expert's, or a shared expert's. gate and gate_up only when
// gated (gate_up on the fused path, gate + up on the plain one).
struct MlpWeights {
  LinearWeights gate, up, gate_up, down;
};

// This rank's share of the model under tensor parallelism (world 1: everything). Attention
// is split by heads: each rank keeps heads/world query heads and the KV heads they read
// (kv_heads_for_rank: an even share, or replicas where ranks share a KV head). MLPs
// (and each MoE expert) are split along the intermediate size, the vocabulary by rows.
struct ShardSpec {
  int rank = 0;
  int world = 1;
  int64_t q_heads = 0, q_head_offset = 0;    // local query heads and the first one's global index
  int64_t kv_heads = 0, kv_head_offset = 0;  // local KV heads and the first one's global index
  int64_t ffn = 0, ffn_offset = 0;  // the dense MLP's intermediate slice
  // The vocabulary is cut in chunks of ceil(vocab / world) rows: rank r holds rows
  // [vocab_offset, vocab_offset + vocab_rows), where vocab_rows < vocab for the last rank
  // when the split is uneven (logits are padded to `vocab` columns for the all-gather).
  int64_t vocab = 0, vocab_offset = 0, vocab_rows = 0;

  // Checks that the model divides evenly; the error names the sizes.
  static StatusOr<ShardSpec> make(const ModelConfig& config, int rank, int world);
  // This rank's [offset, offset + size / world) of an intermediate width that make() checked.
  int64_t share(int64_t size) const { return size / world; }
  int64_t share_offset(int64_t size) const { return rank * (size / world); }
};

struct LayerWeights {
  // Whether this rank holds a slice of the attention / MLP (then its output is a partial
  // sum to all-reduce) or the whole of it (the TP plan kept it replicated).
  bool attn_split = false;
  bool mlp_split = false;                 // dense MLP
  std::vector<bool> expert_split;         // per MoE expert
  bool shared_split = false;              // Qwen2-MoE's shared expert
  // *_b empty for RMSNorm; post_* only with post-norms (Gemma); mlp_norm may be empty in
  // a parallel block whose MLP reads the attention's norm (Falcon-7B).
  Tensor attn_norm_w, attn_norm_b, mlp_norm_w, mlp_norm_b;
  Tensor post_attn_norm_w, post_attn_norm_b, post_mlp_norm_w, post_mlp_norm_b;
  Tensor q_norm, k_norm;  // per-head gammas [head_dim] (Qwen3, Gemma 3)
  LinearWeights q, k, v;  // plain path
  LinearWeights qkv;      // fused path: [(q_heads + 2 * kv_heads) * head_dim, hidden]
  LinearWeights o;
  MlpWeights mlp;                         // dense layers
  LinearWeights router;                   // MoE layers
  std::vector<MlpWeights> experts;        // MoE layers
  MlpWeights shared;                      // Qwen2-MoE
  LinearWeights shared_gate;              // [1, hidden]: sigmoid scale of the shared expert
  bool moe() const { return !experts.empty(); }
};

struct ModelWeights {
  bool vocab_split = false;  // embedding and LM head hold rows [vocab_offset, +vocab) only
  Tensor embed;
  // A tied embedding coded with its LM head (model.bf16_coding): embed is the coded body and
  // this its side tensor (kernels/coded_bf16_layout.h); empty otherwise.
  Tensor embed_side;
  // An untied table kept in a GGUF file's quantized blocks (u8 [vocab, row bytes], in the
  // file's mapping; Backend::embedding_ggml): their ggml type; -1 otherwise.
  int32_t embed_blocks = -1;
  Tensor pos_embed;  // learned positions [max_positions, hidden] (GPT-2), whole on every rank
  Tensor embed_norm_w, embed_norm_b;
  Tensor final_norm_w, final_norm_b;
  LinearWeights lm_head;  // a view of `embed` when tied
  std::vector<LayerWeights> layers;
  // Bytes of weights one decode step streams at batch 1 (every layer, the final norm and
  // the LM head; one embedding row is negligible; MoE counts top_k of the experts).
  int64_t decode_bytes_per_token = 0;
  int64_t total_bytes = 0;
  int32_t lora_sites = 0;  // the linears an adapter may change (LinearWeights::lora_site)
};

struct WeightLoadOptions {
  DType dtype = DType::kF32;  // storage type of the weights
  bool kernel_inject = true;  // pack QKV and gate|up for the fused ops
  ShardSpec shard;            // which part of the model this rank loads
  // Roles by tensor name; nullptr = the default (split everything that can be split).
  // A group (attention; a dense MLP; one expert) is split when its output projection is
  // row-parallel, and then its input projections must be column-parallel.
  const TpPlan* plan = nullptr;
  // Int8 weight-only quantization of the selected linears, slice by slice, after loading
  // (worker/weight_quantization.h).
  QuantizationOptions quant;
  // How those int8 weights are laid out (Transformer::load: the CPU's panels where its
  // kernels read them; rows otherwise).
  Int8WeightLayout int8_layout = Int8WeightLayout::kRows;
  // Copy the tensors that would be used in place from the mapped checkpoint (stored in the
  // model dtype), and are read whole every step, into this process's memory on huge pages:
  // the CPU backend computes from them (a device backend uploads them, so it leaves this off).
  bool own_copies = false;
  // Refuse a tensor holding NaN or Inf (float32/16 and bfloat16 ones; block-quantized ones
  // are not scanned), naming it: such a weight serves silently wrong or empty text.
  bool check_finite = false;
  // false: no LM head is loaded (server.task embed: nothing is sampled); a tied one is the
  // embedding table, which is loaded anyway.
  bool lm_head = true;
  // Called with each layer as soon as it is loaded and quantized (weight streaming moves the
  // layers beyond its budget out of memory there: worker/weight_residency.h).
  std::function<Status(int layer, LayerWeights&)> layer_loaded;
  // Asked before each layer is loaded: true when it filled the layer from elsewhere (a cache
  // file of streamed weights read back: worker/weight_spill.h), which is then not loaded,
  // quantized or handed to layer_loaded.
  std::function<StatusOr<bool>(int layer, LayerWeights&)> layer_restored;
  // Asked before each layer is loaded: true to load it as stored, its matrices neither packed
  // nor copied, where they can stay in the checkpoint's mapping (a layer streamed from the
  // checkpoint file: worker/checkpoint_backing.h).
  std::function<bool(int layer)> layer_as_stored;
};
// model.check_weights auto: the scan is on for checkpoints up to this size.
inline constexpr int64_t kCheckWeightsAutoBytes = int64_t{8} << 30;

StatusOr<ModelWeights> load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                          const WeightLoadOptions& options);

// Calls fn(LinearWeights&) for every linear a layer holds (empty ones included), in one
// fixed order.
template <typename Layer, typename Fn>
void for_each_layer_linear(Layer& lw, Fn&& fn) {
  auto mlp = [&](auto& m) {
    for (auto* l : {&m.gate, &m.up, &m.gate_up, &m.down}) fn(*l);
  };
  for (auto* l : {&lw.q, &lw.k, &lw.v, &lw.qkv, &lw.o, &lw.router, &lw.shared_gate}) fn(*l);
  mlp(lw.mlp);
  mlp(lw.shared);
  for (auto& e : lw.experts) mlp(e);
}

// Calls fn(Tensor&) for every tensor a layer holds (empty ones included).
template <typename Fn>
void for_each_layer_tensor(LayerWeights& lw, Fn&& fn) {
  for (Tensor* t : {&lw.attn_norm_w, &lw.attn_norm_b, &lw.mlp_norm_w, &lw.mlp_norm_b, &lw.post_attn_norm_w,
                    &lw.post_attn_norm_b, &lw.post_mlp_norm_w, &lw.post_mlp_norm_b, &lw.q_norm, &lw.k_norm})
    fn(*t);
  for_each_layer_linear(lw, [&](LinearWeights& l) {
    fn(l.w);
    fn(l.b);
    fn(l.scales);
  });
}

// How many of the layers' linears are held as coded bf16 (what model.bf16_coding became).
inline int coded_bf16_linears(const ModelWeights& w) {
  int coded = 0;
  for (const LayerWeights& lw : w.layers) {
    for_each_layer_linear(lw, [&](const LinearWeights& l) { coded += is_coded_bf16(l.w.view(), l.scales.view()); });
  }
  return coded;
}

// Hands every tensor of `weights` to backend.place_weight, once, so the weights live where
// the backend wants them from load time on (CPU: unchanged; CUDA: device memory, the host
// copies dropped). A tied LM head stays one buffer with the embedding.
// `stays` (may be empty): tensors it names are left where they are (streamed weights' host
// copies, worker/staged_weights.h).
void place_model_weights(ModelWeights& weights, Backend& backend,
                         const std::function<bool(const Tensor&)>& stays = nullptr);

}  // namespace tessera
