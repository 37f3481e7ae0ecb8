#include "worker/activation_memory.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/step_plan.h"

namespace tessera {
namespace {

constexpr int64_t kF32 = 4;

// The buffers a layer's sub-blocks take, in f32 elements (transformer.cc: attention_block,
// mlp, moe_block). Summed, not the larger of them: the pool keeps the attention's buffers for
// the next layer while the MLP takes its own (a smaller free buffer cannot serve a larger
// request), so a step holds both.
int64_t layer_elements(const ActivationWidths& w, int64_t t) {
  const int64_t attention = t * (w.q_width + 2 * w.kv_width) + t * w.q_width;  // q|k|v, attention output
  const int64_t dense = t * w.ffn * (w.gated ? 3 : 1);                          // gate|up, activated
  int64_t moe = 0;
  if (w.experts > 0) {
    // Router logits, top-k weights and ids, a whole-expert output beside the split ones; each
    // expert's rows in and out with its MLP: at most every token (a router may send them all
    // to one), and experts of 4x fewer rows take buffers of their own, a geometric tail of a
    // third more (1 + 1/4 + 1/16 ...); the shared expert.
    const int64_t routing = t * w.experts + 2 * t * w.top_k + t * w.hidden;
    const int64_t experts = 4 * (2 * t * w.hidden + 3 * t * w.expert_ffn) / 3;
    const int64_t shared = w.shared_ffn > 0 ? t * w.hidden + t + 3 * t * w.shared_ffn : 0;
    moe = routing + experts + shared;
  }
  return attention + dense + moe;
}

// The widest input a projection of the step reads: the GEMM packs a copy of it per call on
// the calling thread and keeps that buffer (kernels/cpu/gemm_packed.cc).
int64_t widest_input(const ActivationWidths& w) {
  return std::max({w.hidden, w.q_width, w.ffn, w.expert_ffn, w.shared_ffn});
}

}  // namespace

ActivationWidths ActivationWidths::of(const ModelConfig& c, int world, bool attn_split, bool mlp_split,
                                      bool vocab_split) {
  const int64_t heads_world = attn_split ? world : 1;
  ActivationWidths w;
  w.hidden = c.hidden;
  w.q_width = c.heads / heads_world * c.head_dim;
  // A split group of fewer KV heads than ranks keeps one head per rank.
  w.kv_width = std::max<int64_t>(c.kv_heads / heads_world, 1) * c.head_dim;
  // The dense MLP's buffers only where some layer has one (Mixtral's every layer routes).
  const bool any_dense = c.num_experts == 0 || std::any_of(c.layer.begin(), c.layer.end(),
                                                            [](const LayerSpec& l) { return !l.moe; });
  w.ffn = !any_dense ? 0 : mlp_split ? c.ffn / world : c.ffn;
  w.gated = c.arch == nullptr || c.arch->mlp == MlpKind::kGated;
  w.experts = c.num_experts;
  w.top_k = c.top_k;
  w.expert_ffn = c.num_experts > 0 ? c.moe_ffn : 0;
  w.shared_ffn = c.shared_ffn;
  w.vocab = c.vocab;
  w.vocab_split = vocab_split && world > 1;
  return w;
}

std::string StepActivations::step() const {
  return "a step of " + std::to_string(tokens) + " tokens and " + std::to_string(logit_rows) + " rows of logits";
}

std::string StepActivations::describe() const {
  char mib[32];
  std::snprintf(mib, sizeof(mib), "%.1f MiB", static_cast<double>(bytes()) / (1 << 20));
  return mib + (" for " + step());
}

StepActivations step_activations(const ActivationWidths& w, int64_t tokens, int64_t logit_rows, int threads) {
  const int64_t t = std::max<int64_t>(tokens, 1), r = std::clamp<int64_t>(logit_rows, 0, t);
  // The residual stream, the normalised input, a sub-block's output and a parallel block's
  // second branch live through the step; the logits [r, vocab] (made before the forward pass)
  // too, and with a vocabulary split this rank's part, the part sent and the gathered whole.
  const int64_t stream = 4 * t * w.hidden + t;  // + token ids
  const int64_t logits = r * w.vocab * (w.vocab_split ? 3 : 1);
  const int64_t final_rows = 2 * r * w.hidden + t * w.hidden;  // picked and normed rows; pooled hidden rows
  const int64_t peak = stream + logits + layer_elements(w, t) + final_rows;
  StepActivations a;
  a.tokens = t;
  a.logit_rows = r;
  // Size classes reserve up to a quarter more than asked (kernels/cpu/buffer_pool.h).
  a.pooled = peak * kF32 * 5 / 4;
  // The executor's host copy of the logits (and with a split the gather's host rows), the
  // GEMM's packed input, and the per-thread panels.
  const int64_t host_logits = r * w.vocab * (w.vocab_split ? 3 : 1);
  a.scratch = (host_logits + t * widest_input(w)) * kF32 + std::max(threads, 1) * kKernelScratchBytesPerThread;
  return a;
}

int64_t step_logit_rows(int64_t max_num_batched_tokens, int max_num_seqs, int speculative_tokens, int64_t prompt_rows) {
  const int64_t sampled = int64_t{std::max(max_num_seqs, 1)} * (1 + std::max(speculative_tokens, 0));
  return std::min<int64_t>(max_num_batched_tokens, sampled + std::max<int64_t>(prompt_rows, 0));
}

StepActivations planned_step_activations(const TesseraConfig& config, const ActivationWidths& widths) {
  const int64_t tokens = config.scheduler.max_num_batched_tokens;
  const int proposals = config.speculative.enabled() ? config.speculative.num_tokens : 0;
  const int threads = config.worker.threads > 0 ? config.worker.threads
                                                : static_cast<int>(std::thread::hardware_concurrency());
  const bool rows_cut = config.scheduler.chunked_prefill && config.scheduler.mode == BatchingMode::kContinuous;
  const int64_t prompt_rows = rows_cut ? kPromptLogprobRowsPerStep : tokens;
  const int64_t rows = step_logit_rows(tokens, config.scheduler.max_num_seqs, proposals, prompt_rows);
  return step_activations(widths, tokens, rows, threads);
}

}  // namespace tessera
