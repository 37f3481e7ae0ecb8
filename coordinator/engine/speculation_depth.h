#pragma once
// How many proposals a sequence's next step carries (speculative decoding's k, per sequence):
// the depth that maximises the tokens expected per unit of step cost, from the sequence's
// recent acceptance and what one proposal measurably costs.
//
// With a per-token acceptance a, a step checking k proposals yields E(k) = (1 - a^(k+1)) /
// (1 - a) tokens on average; it costs 1 + c·k plain steps, where c is what making one
// proposal costs relative to the target's step (0 for n-gram lookup; for a draft model the
// executors' measured draft time per forward over their target time). The best k in
// [0, max] is taken; 0 means plain decoding, from which a single probing proposal every few
// steps finds out whether guessing pays again.
#include <cstdint>

namespace tessera {

// A sequence's acceptance, recent evidence weighing most: each checked step is Bernoulli
// evidence — its accepted proposals are successes, and the first rejected one (if any) the
// failure that ended it (later proposals were never tried).
class AcceptanceEstimate {
 public:
  void record(int proposed, int accepted);
  double rate() const { return successes_ / trials_; }

 private:
  static constexpr double kDecay = 0.8;  // weight of the evidence before each new step
  // A prior worth four trials at 0.7, so the first steps do not swing the depth to extremes.
  double successes_ = 2.8;
  double trials_ = 4.0;
};

// The k in [0, max_k] maximising E(k) / (1 + cost_per_proposal · k) (ties to the smaller k).
int best_speculation_depth(double acceptance, double cost_per_proposal, int max_k);

}  // namespace tessera
