#include "bench/model_flops.h"

namespace tessera {
namespace {

double numel(const LinearWeights& l) { return l.w.empty() ? 0.0 : static_cast<double>(l.w.numel()); }

double numel(const MlpWeights& m) { return numel(m.gate) + numel(m.up) + numel(m.gate_up) + numel(m.down); }

}  // namespace

ModelFlops model_flops(const ModelWeights& weights, const ModelConfig& config, int64_t q_heads) {
  ModelFlops f;
  for (const LayerWeights& lw : weights.layers) {
    f.layer_macs_per_token += numel(lw.q) + numel(lw.k) + numel(lw.v) + numel(lw.qkv) + numel(lw.o) +
                              numel(lw.mlp) + numel(lw.router) + numel(lw.shared) + numel(lw.shared_gate);
    for (const MlpWeights& e : lw.experts) {
      f.layer_macs_per_token += numel(e) * static_cast<double>(config.top_k) / static_cast<double>(config.num_experts);
    }
  }
  f.lm_head_macs_per_row = numel(weights.lm_head);
  f.attention_macs_per_pair = 2.0 * static_cast<double>(q_heads * config.head_dim) * static_cast<double>(weights.layers.size());
  return f;
}

double prefill_flops(const ModelFlops& f, int64_t batch, int64_t prompt_len) {
  const double p = static_cast<double>(prompt_len);
  const double pairs = p * (p + 1) / 2;  // query i attends to keys 0..i
  return 2.0 * static_cast<double>(batch) *
         (p * f.layer_macs_per_token + f.lm_head_macs_per_row + pairs * f.attention_macs_per_pair);
}

double decode_flops(const ModelFlops& f, int64_t batch, int64_t prompt_len, int64_t decode_steps) {
  const double s = static_cast<double>(decode_steps);
  // Keys attended over the steps: step s feeds the token at position prompt_len + s - 1,
  // which attends to prompt_len + s keys; summed over s = 1..decode_steps.
  const double keys = s * static_cast<double>(prompt_len) + s * (s + 1) / 2;
  return 2.0 * static_cast<double>(batch) *
         (s * (f.layer_macs_per_token + f.lm_head_macs_per_row) + keys * f.attention_macs_per_pair);
}

}  // namespace tessera
