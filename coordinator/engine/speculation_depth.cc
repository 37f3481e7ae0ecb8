#include "coordinator/engine/speculation_depth.h"

#include <algorithm>
#include <cmath>

namespace tessera {

void AcceptanceEstimate::record(int proposed, int accepted) {
  if (proposed <= 0) return;
  successes_ = kDecay * successes_ + accepted;
  trials_ = kDecay * trials_ + accepted + (accepted < proposed ? 1 : 0);
}

int best_speculation_depth(double acceptance, double cost_per_proposal, int max_k) {
  const double a = std::clamp(acceptance, 0.0, 1.0);
  int best = 0;
  double best_value = 1.0;  // k = 0: one token per plain step
  double expected = 1.0, power = 1.0;
  for (int k = 1; k <= max_k; ++k) {
    power *= a;
    expected += power;  // E(k) = 1 + a + ... + a^k
    const double value = expected / (1.0 + std::max(0.0, cost_per_proposal) * k);
    if (value > best_value * (1.0 + 1e-9)) {
      best = k;
      best_value = value;
    }
  }
  return best;
}

}  // namespace tessera
