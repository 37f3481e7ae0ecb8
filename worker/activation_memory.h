#pragma once
// The memory one forward step's activations take on a rank, planned before the model is
// loaded so that the KV pool is sized beside it (coordinator/cluster/kv_pool_sizing.h) and the
// CPU backend keeps its recycled activation buffers within it (Backend::bound_activation_memory).
//
// Why a plan rather than "whatever is left": a worker in a container whose KV pool took all the
// memory its weights left was killed by the container's limit at the first batch-128 step
// (docs/benchmarks.md, offline batches under a memory limit).
//
// The figure mirrors the buffers worker/transformer.cc and worker/executor.cc allocate for a
// step of `tokens` token rows and `logit_rows` rows of logits (f32): the residual stream and
// its three companions, the attention's (q, k, v, output) and the MLP's (gate, up, activated;
// a MoE layer's router, its experts' rows and the shared expert) buffers, both (the pool keeps
// each sub-block's for the next layer), the logits (gathered whole, with the host copies a
// vocabulary split makes), with a quarter for the buffer pool's size classes; plus what the
// kernels keep per calling thread (the GEMM's packed copy of its widest input) and an
// allowance per thread for its panels. The test (tests/worker/activation_memory_test.cc)
// checks it against what the pool holds for real steps of every fixture model.
#include <cstdint>
#include <string>

#include "common/config.h"
#include "worker/model_config.h"

namespace tessera {

// One rank's widths after the tensor-parallel split.
struct ActivationWidths {
  int64_t hidden = 0;
  int64_t q_width = 0, kv_width = 0;  // query / key-value heads x head_dim this rank computes
  int64_t ffn = 0;                    // the dense MLP's intermediate width this rank computes
  bool gated = true;                  // gate and up (3 x ffn of buffers) or one up (1 x)
  int64_t experts = 0, top_k = 0, expert_ffn = 0, shared_ffn = 0;  // MoE layers (whole widths)
  int64_t vocab = 0;                  // logits are gathered whole on every rank
  bool vocab_split = false;           // the LM head's gather adds host copies

  // From a model's configuration: `attn_split` / `mlp_split` whether this rank computes a
  // 1/world share of the heads / the dense intermediate width (the TP plan may keep them whole).
  static ActivationWidths of(const ModelConfig& config, int world, bool attn_split, bool mlp_split, bool vocab_split);
};

struct StepActivations {
  int64_t tokens = 0, logit_rows = 0;
  int64_t pooled = 0;   // the backend's activation buffers at the step's peak (size classes included)
  int64_t scratch = 0;  // the kernels' per-thread copies and panels
  int64_t bytes() const { return pooled + scratch; }
  // "a step of 4096 tokens and 256 rows of logits".
  std::string step() const;
  // "412.0 MiB for " + step().
  std::string describe() const;
};

// Allowance per thread for the kernels' panels and chunks (a widened weight panel is ~2 MiB:
// kernels/cpu/linear_gemm.cc).
inline constexpr int64_t kKernelScratchBytesPerThread = int64_t{4} << 20;

StepActivations step_activations(const ActivationWidths& widths, int64_t tokens, int64_t logit_rows, int threads);

// The rows of logits a step computes at most: every running sequence's sampled row and its
// speculative proposals, and `prompt_rows` of prompt logprobs (kPromptLogprobRowsPerStep where
// the scheduler cuts chunks to them), and no more than the step's tokens (a row is a token's).
int64_t step_logit_rows(int64_t max_num_batched_tokens, int max_num_seqs, int speculative_tokens, int64_t prompt_rows);

// The plan for a configuration: its largest step, scheduler.max_num_batched_tokens tokens and
// step_logit_rows of logits (speculative.num_tokens proposals when speculation is on; prompt
// logprobs cut to kPromptLogprobRowsPerStep a step with chunked prefill in continuous batching,
// else as many as the step's tokens), on worker.threads threads (0: this host's cores).
StepActivations planned_step_activations(const TesseraConfig& config, const ActivationWidths& widths);

}  // namespace tessera
