#pragma once
// Speculative decoding's draft model on the executors (speculative.method draft): a second,
// smaller Transformer whose KV pool is indexed by the target's block ids — each block holds
// the draft's K/V of the same positions beside the target's — so the scheduler's block
// tables, copy-on-write copies and prefix cache serve both, and rejected proposals are given
// back with the target's. It is fed every committed token the target is fed (a cached prefix
// block therefore holds the draft's K/V too), and after a step it proposes the tokens that may
// follow the sequences that ask (SeqStep::propose): a greedy request gets the draft's argmax,
// a sampled one a draw from the draft's distribution q, kept for the target's check
// (worker/speculative_sampling.h). Its own draws follow the request's seed, so they repeat.
//
//   DraftModel draft(*draft_transformer, backend, block_size, num_blocks, kv_dtype);
//   after each target step: draft.run(feeds) -> proposals; next step: draft.held(id)->q
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/sequence_states.h"
#include "common/status.h"
#include "common/step_plan.h"
#include "worker/kv_cache.h"
#include "worker/sampler.h"
#include "worker/transformer.h"

namespace tessera {

class DraftModel {
 public:
  // A proposal the draft gives less than `min_probability` (speculative.draft_min_probability)
  // ends its sequence's proposals there (a sampled one after it, see choose): unlikely guesses
  // are rarely accepted, and a draft that agrees with nothing then costs one forward per step,
  // not k.
  DraftModel(Transformer& model, Backend& backend, int block_size, int num_blocks, DType kv_dtype,
             double min_probability = 0.0);

  // One sequence's share of the draft's work after a target step.
  struct Feed {
    SeqId seq_id = 0;
    const HeldSequence* state = nullptr;  // its block table and sampling
    int32_t position = 0;                 // of tokens[0]
    // Committed tokens to write K/V for; when proposing, ending with the token just sampled.
    std::vector<int32_t> tokens;
    int32_t propose = 0;      // proposals to make after the last token (0: feed only)
    int32_t token_index = 0;  // the index among generated tokens that the first proposal stands for
    uint64_t seed = 0;        // the request's resolved seed
  };
  // Feeds every feed's tokens in one ragged step, then proposes: a proposing feed's last row
  // gives its first proposal, and each further one costs one more one-token step over the
  // feeds still proposing. One Proposal per proposing feed, in feed order.
  StatusOr<std::vector<Proposal>> run(const std::vector<Feed>& feeds);

  // The proposals last made for a sequence, with the distribution each was drawn from
  // (empty for greedy requests); null when there are none.
  struct Held {
    std::vector<int32_t> tokens;
    std::vector<TokenDistribution> q;
  };
  const Held* held(SeqId id) const;
  void forget(SeqId id) { held_.erase(id); }
  void clear() { held_.clear(); }

  void copy_block(int src, int dst) { cache_.copy_block(src, dst, backend_); }
  void in_use_below(int end) { cache_.in_use_below(end); }
  const Transformer& model() const { return model_; }
  // Forwards the last run() made (1 + the longest proposal chain less one; 0 when it fed nothing).
  int32_t last_forwards() const { return last_forwards_; }

 private:
  // Chooses proposal `j` (0-based) of `f` from its logits row and records it. A greedy
  // request's is none when the draft gives it less than min_probability_; a sampled request's
  // draw is always proposed, and *last says it is under min_probability_ (proposals end after
  // it: the speculative-sampling rule stays exact only if whether a draw is checked does not
  // depend on that draw).
  std::optional<int32_t> choose(const Feed& f, const float* logits, int32_t j, Held& held, bool* last) const;

  Transformer& model_;
  Backend& backend_;
  KvCache cache_;
  std::unordered_map<SeqId, Held> held_;
  std::vector<float> host_logits_;
  int32_t last_forwards_ = 0;
  double min_probability_;
};

// What may be refused before loading: a draft whose vocabulary differs from the target's
// (both sizes named), whose context is shorter than `max_model_len`, or that reads KV a
// sliding window of the target's gives back. Returns the draft's config.
StatusOr<ModelConfig> check_draft_model(const std::string& path, const ModelConfig& target, int64_t max_model_len);

// Whether the draft is split across `world` ranks like the target (its heads and widths
// divide), or replicated whole on every rank.
bool draft_splits(const ModelConfig& draft, int world);

// Loads the draft on this rank with the target's dtype, kernels and quantization: split over
// options.comm (every split the loader can make) when draft_splits says so, else whole.
StatusOr<std::unique_ptr<Transformer>> load_draft_model(const std::string& path, ModelLoadOptions options,
                                                        Backend& backend);

// Bytes one KV block of the draft takes on a rank of `world` (for sizing the shared pool).
int64_t draft_kv_bytes_per_block(const ModelConfig& draft, int world, int block_size, DType dtype);

}  // namespace tessera
