#pragma once
// The seam between the scheduler (coordinator) and the executors (workers): one StepPlan
// in, one StepResult out, per step. Plain structs, no transport: in-process they are passed
// by reference; between processes they are encoded by the wire protocol.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/sampling_params.h"

namespace tessera {

using SeqId = uint64_t;

// The rows of prompt logprobs a step computes at most, with chunked prefill in continuous
// batching (the scheduler cuts a prompt-logprob request's chunk to them): each row is a row of
// logits over the whole vocabulary, so a 4096-token chunk of a 152k-token vocabulary would
// take 2.5 GB. The workers plan their activation memory with them (worker/activation_memory.h).
inline constexpr int kPromptLogprobRowsPerStep = 256;

// How an embedding sequence's final hidden states (after the final norm) become its one vector:
// the last token's row, the mean of every row, or the first row (CLS). kNone: a sequence that
// generates. The executors return each step's share (StepResult::pooled); the scheduler
// finishes the pooling when the prompt is done (coordinator/engine/embedding_pool.h).
enum class Pooling : uint8_t { kNone = 0, kLast = 1, kMean = 2, kCls = 3 };

// Steps carry deltas (docs/wire.md, "Step deltas"): a sequence's state travels in full once,
// on the step that starts it on the executors (new, resumed after preemption, or after the
// executors lost their KV caches); every later step carries only what changed — the tokens
// fed, the block-table entries that changed, how many leading blocks a sliding window has
// released. Executors keep the state (common/sequence_states.h) until the plan lists the
// sequence in `dropped`. So a steady decode step costs O(sequences) bytes, not O(context).

// What the executors keep for a sequence between steps, sent once on its starting step.
struct SeqStart {
  SamplingParams sampling;
  // Tokens that are prompt (of the request, not of this incarnation: a resumed sequence
  // re-feeds prompt + output). The sampler counts generated tokens from here.
  int32_t prompt_len = 0;
  // The tokens before the step's num_computed (a prefix-cache hit skips feeding them), sent
  // only when a penalty is set (the penalties read the whole history); empty otherwise.
  std::vector<int32_t> history;
  // A forked choice (n > 1) starts with a step that feeds no tokens: it samples its first
  // token from the logits of `sample_from`'s last token in the same step (its parent, listed
  // earlier in the plan with sample = true, whose step ends where this one's num_computed
  // says), and shares the KV blocks that step writes. 0 = it samples from its own tokens.
  SeqId sample_from = 0;
  // The whole prompt, sent only when sampling.prompt_logprobs >= 0: a prefill chunk's last row
  // predicts the first token of the next chunk, which the executor has not been fed yet.
  std::vector<int32_t> prompt;
  // Not kNone: an embedding sequence. Its steps never sample (`sample` stays false); each step
  // returns the pooled share of its rows in StepResult::pooled instead.
  Pooling pooling = Pooling::kNone;
  // The LoRA adapter the sequence runs with, by the name it is served under (empty: the base
  // model alone). Every executor holds the adapters the coordinator has loaded.
  std::string lora;
};

// One sequence's share of a step: a prefill chunk or one decode token.
struct SeqStep {
  SeqId seq_id = 0;
  // 1 on the step that starts the sequence on the executors (then `start` is set), +1 on
  // every later step: an executor refuses a step whose version does not follow the one it
  // holds (it missed a step, or lost its state), rather than compute with stale state.
  uint32_t version = 0;
  std::vector<int32_t> tokens;       // the new tokens fed this step (none only for start.sample_from)
  int32_t num_computed = 0;          // tokens already in the KV cache; new ones take positions from here
  // True when this step reaches the end of the known tokens, so a next token must be sampled
  // (false for all but the last chunk of a chunked prefill).
  bool sample = false;
  // Speculative decoding: the last `num_draft` of `tokens` are proposed, not known. The
  // executor samples at each of the last num_draft + 1 rows in turn, as if decoding one by one
  // (same counter of the random draw, same penalty history), and keeps going while what it
  // sampled equals the next proposal: the result holds the accepted proposals then the token
  // sampled after them (1 to num_draft + 1 tokens), and the executor forgets the rejected
  // proposals it was fed (the next step's num_computed counts only the accepted ones). Needs
  // sample and fewer proposals than tokens; with allowed_tokens, one mask per checked row.
  int32_t num_draft = 0;
  static constexpr int32_t kMaxDraft = 16;  // the most proposals one step may carry
  // Proposals made on the executors (a draft model, common/speculative_config.h): after this
  // step samples, propose up to `propose` tokens to follow the last sampled one; they come
  // back in StepResult::proposals for the next step to feed as num_draft. The draft writes
  // scratch KV for the sampled token and the first propose - 1 proposals, so the block table
  // must cover `propose` positions past the step's tokens. Needs sample, at most kMaxDraft.
  int32_t propose = 0;
  // The block table (every block the sequence owns, in order, covering num_computed +
  // tokens) as a change to the one the executors hold: entries from `table_from` on are
  // replaced by `new_blocks` (blocks appended, and a shared last block replaced by its
  // copy-on-write copy); then the first `num_released` entries are -1 (given back because a
  // sliding window has moved past them). A starting step has table_from 0 and the whole table.
  int32_t table_from = 0;
  std::vector<int32_t> new_blocks;
  int32_t num_released = 0;
  std::optional<SeqStart> start;     // present exactly when version == 1
  // Structured output (coordinator/engine/structured/): when not empty, the sampled token must be one
  // of these ids — a bitset, bit t % 32 of word t / 32; ids past the last word are not
  // allowed. Sent on every step that samples, since each token moves the grammar on. With
  // proposals, num_draft + 1 masks of equal length one after another: row i's (the token after
  // proposal i, row 0 the token after the known ones) is the grammar's mask once proposals
  // 1..i are taken.
  std::vector<uint32_t> allowed_tokens;
  // Row i's mask (empty when there is none); the rows' masks are allowed_tokens split evenly.
  std::span<const uint32_t> row_mask(int32_t row) const {
    if (allowed_tokens.empty()) return {};
    const size_t words = allowed_tokens.size() / static_cast<size_t>(num_draft + 1);
    return std::span<const uint32_t>(allowed_tokens).subspan(static_cast<size_t>(row) * words, words);
  }
};

struct StepPlan {
  uint64_t step_id = 0;
  // Sequences whose executor state is to be forgotten before this step runs (finished,
  // aborted or preempted since the last plan). Unknown ids are ignored.
  std::vector<SeqId> dropped;
  std::vector<SeqStep> seqs;
  // Copy-on-write: copy KV block `first` into block `second` before running the step.
  std::vector<std::pair<int32_t, int32_t>> block_copies;
  // Return the raw logits of the sampled rows in StepResult::logits (--dump-logits and
  // reference comparisons; every rank computes them, rank 0 returns them).
  bool return_logits = false;
  // LoRA adapters the executors load before the step runs (served name, PEFT folder), and
  // those they drop (no sequence they hold names them any more): adapters loaded and unloaded
  // while the server runs.
  std::vector<std::pair<std::string, std::string>> lora_loads;
  std::vector<std::string> lora_unloads;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  SeqId seq_id = 0;
  int32_t token = 0;
  float logprob = 0.0f;                  // log-softmax of the chosen token (temperature 1 logits)
  std::vector<TokenLogprob> top_logprobs;  // when sampling.logprobs > 0
};

// The logprob of prompt token `position` (>= 1) given the tokens before it, for a sequence
// whose sampling asks prompt_logprobs (the first prompt token has none: nothing precedes it).
struct PromptLogprob {
  SeqId seq_id = 0;
  int32_t position = 0;
  int32_t token = 0;                     // the prompt token at `position`
  float logprob = 0.0f;                  // log-softmax of the raw logits of row position - 1
  std::vector<TokenLogprob> top_logprobs;  // sampling.prompt_logprobs of them, best first
};

// What an executor's draft model proposes to follow a sequence's last sampled token
// (SeqStep::propose): up to that many tokens, possibly none.
struct Proposal {
  SeqId seq_id = 0;
  std::vector<int32_t> tokens;
};

// An embedding sequence's share of one step (SeqStart::pooling): the sum of the final hidden
// states of the rows this step fed that its pooling takes — every row (mean), the row of
// position 0 (CLS, only on the step that feeds it), the step's last row (last) — and how many.
struct PooledHidden {
  SeqId seq_id = 0;
  int32_t rows = 0;
  std::vector<float> sum;  // [hidden]
};

struct StepResult {
  uint64_t step_id = 0;
  // One per SeqStep with sample == true, in plan order; a step with proposals (num_draft > 0)
  // has 1 to num_draft + 1, consecutive: the accepted proposals, then the next token.
  std::vector<SampledToken> tokens;
  std::string error;                 // empty on success
  std::vector<float> logits;         // [tokens.size(), vocab] when the plan asked for them
  // For the steps whose sequence asks prompt logprobs: one per fed prompt position p + 1 < prompt_len
  // (the row of token p predicts token p + 1), in plan order then position order.
  std::vector<PromptLogprob> prompt_logprobs;
  // The rank leaves the group after this reply: its step failed Unavailable (a collective broke,
  // so a peer is gone). The coordinator counts the rank lost at once instead of waiting for
  // heartbeats to tell, so the failed requests are reported as the workers' outage (503).
  bool leaving = false;
  // One per SeqStep with propose > 0 that sampled, in plan order.
  std::vector<Proposal> proposals;
  // What the step cost this executor: its target model (forward and sampling) and its draft
  // model (draft_forwards forwards, in draft_seconds) — the scheduler weighs a proposal's
  // cost by them (coordinator/engine/speculation_depth.h). 0 where not measured.
  float target_seconds = 0.0f;
  float draft_seconds = 0.0f;
  int32_t draft_forwards = 0;
  // One per SeqStep of an embedding sequence whose pooling took a row this step, in plan order.
  std::vector<PooledHidden> pooled;
};

}  // namespace tessera
