// The scheduler's answer to a finished step: Scheduler::on_step_result validates the
// executors' result against its plan, then advances, commits, samples into or ends each
// sequence the step ran (speculative steps in scheduler_speculation.cc, masks in
// scheduler_masks.cc); embedding sequences gather their pooled hidden states here.
#include "coordinator/engine/scheduler.h"

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"

namespace tessera {

std::vector<SequenceEvent> Scheduler::on_step_result(const StepPlan& plan, const StepResult& result) {
  std::vector<SequenceEvent> events;
  // Validate the whole result before applying any of it.
  std::string error = result.error;
  if (error.empty() && result.step_id != plan.step_id)
    error = "step result " + std::to_string(result.step_id) + " does not answer plan " + std::to_string(plan.step_id);
  if (error.empty()) {
    size_t r = 0;
    for (const SeqStep& s : plan.seqs) {
      if (!s.sample) continue;
      if (r >= result.tokens.size() || result.tokens[r].seq_id != s.seq_id) {
        error = "step " + std::to_string(plan.step_id) + " returned no token for sequence " + std::to_string(s.seq_id);
        break;
      }
      // One token, or with proposals the accepted ones and the next: at most num_draft + 1.
      size_t n = 1;
      while (r + n < result.tokens.size() && result.tokens[r + n].seq_id == s.seq_id) ++n;
      if (n > static_cast<size_t>(s.num_draft) + 1) {
        error = "step " + std::to_string(plan.step_id) + " returned " + std::to_string(n) + " tokens for sequence " +
                std::to_string(s.seq_id) + ", which fed " + std::to_string(s.num_draft) + " proposals";
        break;
      }
      r += n;
    }
    if (error.empty() && r != result.tokens.size())
      error = "step " + std::to_string(plan.step_id) + " returned " + std::to_string(result.tokens.size()) +
              " tokens for " + std::to_string(r) + " sampled sequences";
  }

  // A failed step may not have reached every executor: its drops go out again.
  if (!error.empty()) dropped_.insert(dropped_.end(), plan.dropped.begin(), plan.dropped.end());
  size_t r = 0;
  size_t lp = 0;  // result.prompt_logprobs is in plan order
  std::vector<PendingMask> masks_pending;
  std::unordered_map<SeqId, const std::vector<int32_t>*> proposals_of;  // made on the executors
  std::unordered_map<SeqId, const PooledHidden*> pooled_of;            // embedding sequences' shares
  if (error.empty()) {
    for (const Proposal& p : result.proposals) proposals_of[p.seq_id] = &p.tokens;
    for (const PooledHidden& p : result.pooled) pooled_of[p.seq_id] = &p;
    // What a draft forward costs next to the target's step, as measured (a moving average).
    if (result.draft_forwards > 0 && result.target_seconds > 0) {
      const double ratio = result.draft_seconds / result.draft_forwards / result.target_seconds;
      draft_cost_ = draft_cost_ < 0 ? ratio : 0.9 * draft_cost_ + 0.1 * ratio;
    }
  }
  for (const SeqStep& s : plan.seqs) {
    const SampledToken* token = s.sample && error.empty() ? &result.tokens[r++] : nullptr;
    // With proposals, the step's other tokens (validated above: consecutive, same sequence).
    size_t num_returned = token != nullptr ? 1 : 0;
    while (token != nullptr && r < result.tokens.size() && result.tokens[r].seq_id == s.seq_id) {
      ++r;
      ++num_returned;
    }
    std::vector<PromptLogprob> prompt_lps;
    while (error.empty() && lp < result.prompt_logprobs.size() && result.prompt_logprobs[lp].seq_id == s.seq_id)
      prompt_lps.push_back(result.prompt_logprobs[lp++]);
    auto it = entries_.find(s.seq_id);
    // Aborted (or aborted and re-added) since the plan was made: drop its result.
    if (it == entries_.end() || it->second->scheduled_step != plan.step_id + 1 || !it->second->seq.is_running())
      continue;
    Entry& e = *it->second;
    if (!error.empty()) {
      // Choices not forked yet end with their parent: each gets its own event.
      const int unforked = e.seq.fork_pending() ? e.seq.request().n : 1;
      finish(e, FinishReason::kError);
      for (int c = 0; c < unforked; ++c)
        events.push_back(SequenceEvent{choice_seq_id(e.seq.request_id(), c == 0 ? e.seq.choice() : c),
                                       {}, true, FinishReason::kError, error, {}, {}});
      entries_.erase(it);
      continue;
    }
    TESSERA_CHECK_EQ(e.seq.num_computed(), s.num_computed) << "sequence " << s.seq_id << " changed under its step";
    e.draft_in_flight = 0;
    // Proposals answer the next step only (they follow the token this one sampled).
    const auto made = proposals_of.find(s.seq_id);
    e.executor_proposals = made != proposals_of.end() && s.propose > 0 ? *made->second : std::vector<int32_t>{};
    if (e.executor_proposals.size() > static_cast<size_t>(s.propose)) e.executor_proposals.resize(static_cast<size_t>(s.propose));
    if (s.num_draft > 0) {
      SequenceEvent event{s.seq_id, {}, false, FinishReason::kNone, {}, std::move(prompt_lps), {}};
      const bool grammar_left = apply_speculative_tokens(e, s, std::span<const SampledToken>(token, num_returned), event);
      if (event.finished) entries_.erase(s.seq_id);
      if (grammar_left) {
        finish_sampled_token(e, std::move(event), events, masks_pending);
      } else {
        events.push_back(std::move(event));
      }
      continue;
    }
    e.seq.advance(static_cast<int>(s.tokens.size()));
    blocks_.commit(s.seq_id, e.seq.token_ids(), e.seq.num_computed());
    // The window moved on: what only the tokens just passed read is free for anyone now.
    blocks_.release_blocks_before(s.seq_id, first_needed_key(e.seq.num_computed()));
    if (e.seq.request().pooling != Pooling::kNone) {
      const auto share = pooled_of.find(s.seq_id);
      take_pooled_share(e, share == pooled_of.end() ? nullptr : share->second);
      if (e.seq.num_computed() < e.seq.num_tokens()) continue;
      SequenceEvent event{s.seq_id, {}, false, FinishReason::kNone, {}, {}, {}};
      event.embedding = pooled_embedding(e);
      if (event.embedding.empty()) {
        event.error = "the executors returned no hidden state for embedding " + std::to_string(s.seq_id);
        end_sequence(e, event, FinishReason::kError);
      } else {
        end_sequence(e, event, FinishReason::kStop);
      }
      events.push_back(std::move(event));
      continue;
    }
    if (token == nullptr) {
      if (!prompt_lps.empty()) events.push_back(SequenceEvent{s.seq_id, {}, false, FinishReason::kNone, {}, std::move(prompt_lps), {}});
      continue;
    }
    e.seq.append_token(token->token);
    // The draft's scratch slots past the known tokens go back.
    if (s.propose > 0) blocks_.truncate(s.seq_id, e.seq.num_tokens());
    finish_sampled_token(e, SequenceEvent{s.seq_id, {*token}, false, FinishReason::kNone, {}, std::move(prompt_lps), {}},
                         events, masks_pending);
  }
  // The next masks, in parallel over the step's constrained sequences: one whose grammar
  // state is new walks the vocabulary trie (up to milliseconds), and done one after another
  // the step would wait for the sum of those walks before it is dispatched. They are computed
  // here, before the next plan, rather than overlapped with the next forward pass: the plan
  // carries the masks to rank 0's sampler (docs/wire.md), and on the CPU backend the forward
  // pass already uses every core, so overlapping would only take cores from it, whereas
  // between two steps the workers wait and the cores are free (docs/structured-output.md).
  std::vector<Entry*> constrained;
  for (const PendingMask& p : masks_pending) constrained.push_back(p.entry);
  const std::vector<char> ready = prepare_masks(constrained);
  for (size_t i = 0; i < masks_pending.size(); ++i) {
    Entry& e = *masks_pending[i].entry;
    SequenceEvent& event = events[masks_pending[i].event];
    if (ready[i]) {
      end_if_mask_or_length_stops(e, event);
      continue;
    }
    // Over the budget: the other sequences go on; this one waits for its mask unless its
    // length already ends it.
    if (const FinishReason reason = e.seq.stop_reason(max_len_); reason != FinishReason::kNone) {
      end_sequence(e, event, reason);
      continue;
    }
    defer_mask(e);
  }
  return events;
}

void Scheduler::take_pooled_share(Entry& e, const PooledHidden* share) {
  if (share == nullptr || share->rows <= 0) return;
  const bool add = e.seq.request().pooling == Pooling::kMean;
  if (!add || e.pooled_sum.size() != share->sum.size()) {
    // Last: the latest step's row; CLS: the row of position 0 (its step alone returns one).
    e.pooled_sum.assign(share->sum.size(), 0.0);
    e.pooled_rows = 0;
  }
  for (size_t k = 0; k < share->sum.size(); ++k) e.pooled_sum[k] += share->sum[k];
  e.pooled_rows += share->rows;
}

std::vector<float> Scheduler::pooled_embedding(const Entry& e) {
  if (e.pooled_rows == 0) return {};
  std::vector<float> out(e.pooled_sum.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(e.pooled_sum[k] / e.pooled_rows);
  return out;
}

void Scheduler::finish_sampled_token(Entry& e, SequenceEvent event, std::vector<SequenceEvent>& events,
                                     std::vector<PendingMask>& masks_pending) {
  // A grammar that proved costly steps on the warmer: the token goes out now, its verdict
  // (and the next mask) when advance_deferred_masks takes them up.
  if (config_.structured_mask_budget_ms > 0 && e.seq.is_constrained() &&
      (e.slow_grammar || e.seq.grammar_costly())) {
    if (const FinishReason length = e.seq.stop_reason(max_len_); length != FinishReason::kNone) {
      end_sequence(e, event, length);
    } else {
      defer_step(e);
    }
    events.push_back(std::move(event));
    return;
  }
  // Structured output first: a completed grammar ends the choice ("stop") whatever the
  // length; a broken one ends it with the error.
  const auto grammar_start = std::chrono::steady_clock::now();
  const std::optional<FinishReason> applied = e.seq.apply_constraint_until(mask_deadline(), &event.error);
  if (!applied) {  // its grammar is busy on another thread (the warmer): step it there too
    e.slow_grammar = true;
    defer_step(e);
    events.push_back(std::move(event));
    return;
  }
  FinishReason reason = *applied;
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - grammar_start).count() > mask_budget_seconds())
    e.slow_grammar = true;
  if (reason == FinishReason::kNone && e.seq.is_constrained()) {
    // Its grammar goes on: on_step_result computes the next mask with the step's other ones.
    masks_pending.push_back({&e, events.size()});
    events.push_back(std::move(event));
    return;
  }
  if (reason == FinishReason::kNone) reason = e.seq.stop_reason(max_len_);
  if (reason != FinishReason::kNone) end_sequence(e, event, reason);
  events.push_back(std::move(event));
}

}  // namespace tessera
