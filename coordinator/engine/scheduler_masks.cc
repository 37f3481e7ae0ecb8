// The scheduler's structured-output masks beyond the step path: the budget a step waits for
// masks (scheduler.structured_mask_budget_ms), and the sequences whose mask or grammar step
// the MaskWarmer finishes meanwhile (docs/structured-output.md, "A costly grammar slows only
// its own request").
#include "coordinator/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace tessera {

int Scheduler::chunk_before_mask(const Entry& e, int remaining, int chunk) const {
  if (!e.mask_deferred) return chunk;
  // The chunk that completes the prompt samples: it waits for the mask. Only chunked,
  // continuous batching can take the rest of the prompt first.
  if (!config_.chunked_prefill || config_.mode == BatchingMode::kStatic) return 0;
  return std::min(chunk, remaining - 1);
}

void Scheduler::defer_mask(Entry& e) {
  e.mask_deferred = true;
  e.warm = std::make_shared<structured::WarmResult>();
  mask_warmer_.submit_mask(e.seq.mask_grammar(), e.seq.mask_state(), e.warm);
  deferred_masks_.push_back(e.seq.id());
  ++deferred_masks_total_;
}

void Scheduler::defer_step(Entry& e) {
  e.mask_deferred = true;
  e.warm = std::make_shared<structured::WarmResult>();
  mask_warmer_.submit_step(e.seq.mask_grammar(), e.seq.mask_state(), e.seq.constraint_end_tokens(),
                           e.seq.token_ids().back(), e.warm);
  deferred_masks_.push_back(e.seq.id());
  ++deferred_masks_total_;
}

double Scheduler::mask_budget_seconds() const {
  if (config_.structured_mask_budget_ms <= 0) return std::numeric_limits<double>::infinity();
  double budget = config_.structured_mask_budget_ms / 1000.0;
  // Before any step was timed the configured budget holds; a floor keeps warm-cache lookups
  // and small walks on the step path however short the steps.
  if (recent_step_seconds_ > 0) budget = std::min(budget, std::max(recent_step_seconds_, 0.0005));
  return budget;
}

std::chrono::steady_clock::time_point Scheduler::mask_deadline() const {
  const double budget = mask_budget_seconds();
  if (!std::isfinite(budget)) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(budget));
}

std::vector<char> Scheduler::prepare_masks(const std::vector<Entry*>& entries) {
  std::vector<char> ready(entries.size(), 0);
  if (entries.empty()) return ready;
  const auto deadline = mask_deadline();
  mask_pool_.run(entries.size(), [&](size_t i) { ready[i] = entries[i]->seq.prepare_token_mask_until(deadline); });
  return ready;
}

namespace {

bool mask_allows(const std::vector<uint32_t>& mask, int32_t token) {
  const auto id = static_cast<size_t>(token);
  return token >= 0 && id / 32 < mask.size() && ((mask[id / 32] >> (id % 32)) & 1u) != 0;
}

bool allows_any(const std::vector<uint32_t>& mask) {
  return std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
}

}  // namespace

void Scheduler::fit_proposals_to_grammar(Entry& e, std::vector<int32_t>* draft) {
  e.proposal_steps.clear();
  e.proposal_masks.clear();
  Sequence& seq = e.seq;
  if (!seq.is_constrained() || draft->empty()) return;
  const structured::TokenConstraint& grammar = *seq.mask_grammar();
  const std::vector<int32_t> end_tokens = seq.constraint_end_tokens();
  // Greedy requests and lookup proposals keep a proposal exactly when the target's own draw
  // gives it, so a cut anywhere changes no token: proposals end before the first the grammar
  // forbids, ends or completes on, or whose next mask is not ready within the step's mask
  // budget. A sampled request checking the executors' draft by the speculative-sampling rule
  // is exact only if whether a position is checked does not depend on the proposal there: so
  // the first proposal the grammar stops on is still sent, as the last (a forbidden one is
  // surely rejected, p being 0 under the mask; an ending one ends the choice if accepted), and
  // its masks are computed however long they take (costly grammars never speculate).
  const bool by_rule = proposer_->made_on_executors() && seq.sampling().temperature > 0.0f;
  const auto deadline = by_rule ? std::chrono::steady_clock::time_point::max() : mask_deadline();
  structured::MatchState state = seq.mask_state();
  size_t kept = 0;
  for (; kept < draft->size(); ++kept) {
    const int32_t token = (*draft)[kept];
    const std::vector<uint32_t>& row = kept == 0 ? *seq.next_token_mask() : e.proposal_masks.back();
    std::optional<structured::ConstraintStep> step;
    if (mask_allows(row, token)) step = structured::step_constraint_until(grammar, state, end_tokens, token, deadline);
    std::vector<uint32_t> next;
    if (step && step->verdict == structured::ConstraintVerdict::kContinue &&
        structured::mask_after_until(grammar, step->next, end_tokens, &next, deadline) && allows_any(next)) {
      state = step->next;
      e.proposal_steps.push_back(std::move(*step));
      e.proposal_masks.push_back(std::move(next));
      continue;
    }
    if (!by_rule) break;
    // (No deadline here.) The grammar stops on this proposal: forbidden, ending the output,
    // completing the grammar, or leaving no token to follow — the last three end the choice
    // when it is accepted, so the row after it is never sampled from.
    if (!step) step = structured::step_constraint(grammar, state, end_tokens, token);
    if (step->verdict == structured::ConstraintVerdict::kContinue) {
      step->verdict = structured::ConstraintVerdict::kViolated;
      step->error = structured::kNoTokenContinues;
    }
    std::vector<uint32_t> unused = row;
    e.proposal_steps.push_back(std::move(*step));
    e.proposal_masks.push_back(std::move(unused));
    ++kept;
    break;
  }
  draft->resize(kept);
}

void Scheduler::end_if_mask_or_length_stops(Entry& e, SequenceEvent& event) {
  FinishReason reason = e.seq.check_token_mask(&event.error);
  if (reason == FinishReason::kNone) reason = e.seq.stop_reason(max_len_);
  if (reason != FinishReason::kNone) end_sequence(e, event, reason);
}

std::vector<SequenceEvent> Scheduler::advance_deferred_masks() {
  std::vector<SequenceEvent> events;
  std::vector<SeqId> waiting;
  waiting.swap(deferred_masks_);
  for (SeqId id : waiting) {
    auto it = entries_.find(id);
    if (it == entries_.end() || !it->second->mask_deferred) continue;  // ended meanwhile
    Entry& e = *it->second;
    if (!e.warm->done.load(std::memory_order_acquire)) {
      deferred_masks_.push_back(id);
      continue;
    }
    SequenceEvent event{e.seq.id(), {}, false, FinishReason::kNone, {}, {}, {}};
    if (e.warm->step) {
      // The grammar's step by the token sent earlier: its verdict now.
      const FinishReason reason = e.seq.apply_constraint_step(std::move(*e.warm->step), &event.error);
      e.warm->step.reset();
      if (reason != FinishReason::kNone) {
        end_sequence(e, event, reason);
        events.push_back(std::move(event));
        continue;
      }
    }
    if (!e.seq.take_cached_token_mask()) {
      defer_mask(e);  // done, yet gone from the grammar's cache again (over its memory bound)
      continue;
    }
    e.mask_deferred = false;
    e.warm.reset();
    end_if_mask_or_length_stops(e, event);
    if (event.finished) events.push_back(std::move(event));
  }
  return events;
}

}  // namespace tessera
