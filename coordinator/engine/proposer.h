#pragma once
// Speculative decoding's proposals: tokens that may follow a sequence, which one step of the
// target model then checks all at once (common/step_plan.h SeqStep::num_draft). The scheduler
// asks a Proposer for each decoding sequence it speculates on and feeds what comes back; how
// the proposals were made is the proposer's business, so new kinds (a draft model, EAGLE
// heads, MTP layers, whose proposals come back from the workers with a step's result) plug
// in here without the scheduler changing.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/speculative_config.h"

namespace tessera {

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Up to `max_tokens` tokens that may follow `tokens` (a sequence's prompt then output);
  // none when it has no guess. `from_executors`: what the executors proposed after the
  // sequence's last step (SeqStep::propose), for proposers whose proposals are made there.
  virtual std::vector<int32_t> propose(std::span<const int32_t> tokens, std::span<const int32_t> from_executors,
                                       int max_tokens) const = 0;
  // True when the executors make the proposals (a draft model; later EAGLE heads, MTP
  // layers): the scheduler then asks for them on each step that samples (SeqStep::propose).
  virtual bool made_on_executors() const { return false; }
};

// Prompt lookup: the longest suffix of n tokens (n from ngram_max down to ngram_min) that
// also occurs earlier in the sequence, at its latest such place; proposes the tokens that
// followed it there. Costs O(length x ngram_max) per call.
class NgramProposer final : public Proposer {
 public:
  NgramProposer(int ngram_min, int ngram_max) : ngram_min_(ngram_min), ngram_max_(ngram_max) {}
  std::vector<int32_t> propose(std::span<const int32_t> tokens, std::span<const int32_t> from_executors,
                               int max_tokens) const override;

 private:
  int ngram_min_, ngram_max_;
};

// The executors' draft model (worker/draft_model.h): hands on what it proposed after the
// sequence's last step.
class ExecutorProposer final : public Proposer {
 public:
  std::vector<int32_t> propose(std::span<const int32_t> tokens, std::span<const int32_t> from_executors,
                               int max_tokens) const override;
  bool made_on_executors() const override { return true; }
};

// The configured proposer; null for method none.
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config);

}  // namespace tessera
