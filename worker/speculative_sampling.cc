#include "worker/speculative_sampling.h"

#include <algorithm>
#include <vector>

#include "common/splitmix64.h"

namespace tessera {

uint64_t speculative_stream_seed(uint64_t seed, SpeculativeStream stream) {
  return splitmix64(seed ^ splitmix64(0x5bec0000ULL + static_cast<uint64_t>(stream)));
}

ProposalVerdict verify_proposal(const SampleRequest& target, int32_t proposal, const TokenDistribution& q) {
  const TokenDistribution p = token_distribution(target);
  const auto index = static_cast<uint64_t>(target.token_index);
  const double q_x = q.prob(proposal);
  const double p_x = p.prob(proposal);
  const double u = counter_uniform(speculative_stream_seed(target.seed, SpeculativeStream::kAccept), index);
  if (q_x > 0 && u * q_x < p_x) return {proposal, true};
  // Rejected: the residual max(0, p - q) over p's candidates (where p is 0 so is the residual).
  std::vector<double> q_dense(static_cast<size_t>(target.vocab), 0.0);
  for (size_t i = 0; i < q.ids.size(); ++i) q_dense[static_cast<size_t>(q.ids[i])] = q.weights[i] / q.total;
  TokenDistribution residual;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double w = p.weights[i] / p.total - q_dense[static_cast<size_t>(p.ids[i])];
    if (w <= 0) continue;
    residual.ids.push_back(p.ids[i]);
    residual.weights.push_back(w);
    residual.total += w;
  }
  // Rounding can leave nothing (p and q equal to the last bit): then p itself.
  const TokenDistribution& from = residual.total > 0 ? residual : p;
  const double v = counter_uniform(speculative_stream_seed(target.seed, SpeculativeStream::kResidual), index);
  return {draw_token(from, v), false};
}

}  // namespace tessera
