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
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "worker/sampler.h"

namespace tessera {

enum class SpeculativeStream : uint64_t { kDraft = 1, kAccept = 2, kResidual = 3 };
// The seed of one role's stream for a request seeded `seed`.
uint64_t speculative_stream_seed(uint64_t seed, SpeculativeStream stream);

struct ProposalVerdict {
  int32_t token = 0;
  bool accepted = false;  // token is the proposal
};
// Checks proposals[i], drawn from q[i], at the target row targets[i] (temperature > 0; each
// with the request's seed and the proposal's token_index), every row in one call of
// Backend::rejection_sample_rows on `backend`: the target's distribution p and the draft's q
// go there as dense rows. A row's verdict does not depend on the others' (each draw is
// counter-based), so the caller keeps the verdicts up to the first rejection.
std::vector<ProposalVerdict> verify_proposals(Backend& backend, std::span<const SampleRequest> targets,
                                              std::span<const int32_t> proposals,
                                              std::span<const TokenDistribution> q);

}  // namespace tessera
