// The scheduler's speculative decoding (docs/scheduler.md, "Speculative decoding"): which
// sequences speculate and how deep, their proposals, and the tokens a checked step brings back.
// The grammar side of proposals is in scheduler_masks.cc.
#include "coordinator/engine/scheduler.h"

#include <algorithm>

#include "common/check.h"

namespace tessera {

bool Scheduler::apply_speculative_tokens(Entry& e, const SeqStep& s, std::span<const SampledToken> tokens,
                                         SequenceEvent& event) {
  const SeqId id = s.seq_id;
  const auto accepted = static_cast<int>(tokens.size()) - 1;
  ++spec_stats_.num_drafts;
  spec_stats_.num_draft_tokens += static_cast<uint64_t>(s.num_draft);
  spec_stats_.num_accepted_tokens += static_cast<uint64_t>(accepted);
  for (int i = 0; i < accepted && static_cast<size_t>(i) < spec_stats_.accepted_per_pos.size(); ++i)
    ++spec_stats_.accepted_per_pos[static_cast<size_t>(i)];
  e.acceptance.record(s.num_draft, accepted);
  // The known tokens fed are in the KV cache now; each accepted proposal joins them as it is
  // appended (its KV was written by this step); the last token is the next to feed.
  e.seq.advance(static_cast<int>(s.tokens.size()) - s.num_draft);
  const bool constrained = e.seq.is_constrained();
  TESSERA_CHECK(!constrained || e.proposal_steps.size() + 1 >= tokens.size())
      << "sequence " << id << ": " << tokens.size() - 1 << " proposals accepted, " << e.proposal_steps.size()
      << " stepped through its grammar";
  for (size_t i = 0; i < tokens.size(); ++i) {
    e.seq.append_token(tokens[i].token);
    event.new_tokens.push_back(tokens[i]);
    const bool last = i + 1 == tokens.size();
    // The last token's grammar step and next mask are the caller's, as for any sampled token.
    if (constrained && last) break;
    // An accepted proposal moves the grammar by the step taken when it was proposed; the
    // grammar goes first, as for a token sampled alone (a completed grammar ends the choice).
    FinishReason reason = FinishReason::kNone;
    if (constrained) reason = e.seq.apply_constraint_step(std::move(e.proposal_steps[i]), &event.error);
    if (reason == FinishReason::kNone) reason = e.seq.stop_reason(max_len_);
    if (reason != FinishReason::kNone) {
      finish(e, reason);  // frees every block, the rejected proposals' too
      event.finished = true;
      event.reason = reason;
      return false;
    }
    if (!last) e.seq.advance(1);
  }
  // Blocks that only rejected proposals reached go back; the prefix cache learns only
  // committed tokens (num_computed counts accepted proposals, never rejected ones).
  blocks_.truncate(id, e.seq.num_tokens());
  blocks_.commit(id, e.seq.token_ids(), e.seq.num_computed());
  blocks_.release_blocks_before(id, first_needed_key(e.seq.num_computed()));
  return constrained;
}

int Scheduler::next_speculation_depth(Entry& e) {
  // A proposal costs nothing to make by lookup; a draft model's costs its measured share;
  // checking it costs its row in the step (verify_cost_per_proposal) — except for a seeded
  // sampled request, whose tokens depend on the depths taken (which draws are used), so they
  // follow its acceptance alone and the seed repeats its output.
  const SamplingParams& sp = e.seq.sampling();
  const bool seeded_draws = sp.temperature > 0.0f && sp.seed.has_value();
  const double draft = proposer_->made_on_executors() ? std::max(0.0, draft_cost_) : 0.0;
  const double cost = seeded_draws ? 0.0 : draft + verify_cost_per_proposal();
  const int k = best_speculation_depth(e.acceptance.rate(), cost, config_.speculative.num_tokens);
  if (k > 0) {
    e.spec_rest = 0;
    return k;
  }
  // Backed off to none: one proposal now and then tells whether the guesses got better.
  if (++e.spec_rest < kSpeculationProbeEvery) return 0;
  e.spec_rest = 0;
  return 1;
}

double Scheduler::verify_cost_per_proposal() const {
  const RowCostCurve& curve = config_.row_costs;
  const int decoding = std::max(1, step_decoding_);
  const double step = curve.seconds(decoding);
  if (!(step > 0)) return 0.0;
  return curve.marginal_seconds(decoding + step_proposal_rows_) * decoding / step;
}

bool Scheduler::may_speculate(const Entry& e) const {
  const Sequence& seq = e.seq;
  const bool grammar_stepped_here = !seq.is_constrained() || (!e.slow_grammar && !seq.grammar_costly());
  return proposer_ && seq.request().speculative && grammar_stepped_here && !seq.fork_pending();
}

int Scheduler::tokens_left(const Sequence& seq) const {
  return std::min(seq.max_new_tokens() - seq.num_output(), max_len_ - seq.num_tokens());
}

std::vector<int32_t> Scheduler::proposals_for(Entry& e, int room) {
  const Sequence& seq = e.seq;
  if (!may_speculate(e) || seq.num_uncomputed() != 1) return {};
  // No more than could still be output (the token after the proposals is one more), nor
  // past the longest sequence; the executors' proposals were sized when asked for.
  const int left = tokens_left(seq) - 1;
  const int depth = proposer_->made_on_executors() ? config_.speculative.num_tokens : next_speculation_depth(e);
  const int most = std::min({depth, room, left});
  if (most <= 0) return {};
  std::vector<int32_t> draft = proposer_->propose(seq.token_ids(), e.executor_proposals, most);
  fit_proposals_to_grammar(e, &draft);
  return draft;
}

int Scheduler::ask_executor_proposals(Entry& e, int end, StepPlan& plan) {
  const Sequence& seq = e.seq;
  if (!may_speculate(e) || !proposer_->made_on_executors() || end < seq.num_tokens()) return 0;
  // What the next step can still use: proposals before the last token the choice may output
  // (this step samples one more).
  const int left = tokens_left(seq) - 2;
  const int k = std::min(next_speculation_depth(e), left);
  // The draft's scratch slots, only where the pool has room as it is (never preempting).
  if (k <= 0 || !blocks_.append_slots(seq.id(), seq.num_computed(), end + k, &plan.block_copies)) return 0;
  return k;
}

}  // namespace tessera
