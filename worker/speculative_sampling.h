#pragma once
// Speculative sampling's rule (Leviathan et al. 2023, Chen et al. 2023) for a proposal the
// executor's draft model drew from its distribution q: the target keeps it with probability
// min(1, p(x) / q(x)), and otherwise draws from the residual max(0, p - q), renormalised; the
// token that comes out is distributed exactly as p, the target's own sampling distribution
// (worker/sampler.h: temperature, top-k/p, min-p, penalties, logit_bias).
//
// Every draw is counter-based on (seed, index of the token), each role on its own stream —
// the draft's draw, the acceptance test, the residual draw — so a seeded request gives the
// same tokens every run; the token after the last kept proposal is the target's plain draw
// (sample_token's stream).
#include <cstdint>

#include "worker/sampler.h"

namespace tessera {

enum class SpeculativeStream : uint64_t { kDraft = 1, kAccept = 2, kResidual = 3 };
// The seed of one role's stream for a request seeded `seed`.
uint64_t speculative_stream_seed(uint64_t seed, SpeculativeStream stream);

struct ProposalVerdict {
  int32_t token = 0;
  bool accepted = false;  // token is the proposal
};
// Checks `proposal`, drawn from `q`, at the target row `target` (temperature > 0; its seed and
// token_index are the request's and the proposal's).
ProposalVerdict verify_proposal(const SampleRequest& target, int32_t proposal, const TokenDistribution& q);

}  // namespace tessera
