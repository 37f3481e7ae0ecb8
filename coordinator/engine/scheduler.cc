#include "coordinator/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/splitmix64.h"

namespace tessera {
namespace {

// A fixed function of the id, so a recomputed sequence draws the same tokens again.
uint64_t default_seed(SeqId id) { return splitmix64(id); }

std::string request_name(RequestId id) { return "request " + std::to_string(id); }

}  // namespace

Status validate_scheduler_config(const SchedulerConfig& c) {
  if (c.block_size < 1) return invalid_argument("scheduler: block_size must be >= 1, got " + std::to_string(c.block_size));
  if (c.num_blocks < 1) return invalid_argument("scheduler: num_blocks must be >= 1, got " + std::to_string(c.num_blocks));
  if (c.max_num_seqs < 1)
    return invalid_argument("scheduler: max_num_seqs must be >= 1, got " + std::to_string(c.max_num_seqs));
  if (c.max_num_batched_tokens < 1)
    return invalid_argument("scheduler: max_num_batched_tokens must be >= 1, got " +
                            std::to_string(c.max_num_batched_tokens));
  if (c.max_model_len < 2)
    return invalid_argument("scheduler: max_model_len must be >= 2, got " + std::to_string(c.max_model_len));
  if (c.sliding_window < 0)
    return invalid_argument("scheduler: sliding_window must be >= 0, got " + std::to_string(c.sliding_window));
  if (!(c.max_decode_slowdown == 0 || (c.max_decode_slowdown > 1 && c.max_decode_slowdown <= 1000)))
    return invalid_argument("scheduler: max_decode_slowdown must be 0 or in (1, 1000], got " +
                            std::to_string(c.max_decode_slowdown));
  if (!(c.max_tpot_slowdown == 0 || (c.max_tpot_slowdown > 1 && c.max_tpot_slowdown <= 1000)))
    return invalid_argument("scheduler: max_tpot_slowdown must be 0 or in (1, 1000], got " +
                            std::to_string(c.max_tpot_slowdown));
  if (c.speculative.enabled()) TESSERA_RETURN_IF_ERROR(validate_speculative_config(c.speculative));
  if (c.max_loras < 0) return invalid_argument("scheduler: max_loras must be >= 0, got " + std::to_string(c.max_loras));
  return Status::ok();
}

Scheduler::Scheduler(SchedulerConfig config)
    : config_(config),
      max_len_(0),
      blocks_(config.block_size, config.num_blocks, config.prefix_caching) {
  const Status st = validate_scheduler_config(config_);
  TESSERA_CHECK(st.is_ok()) << st.to_string();
  proposer_ = make_proposer(config_.speculative);
  if (proposer_) spec_stats_.accepted_per_pos.assign(static_cast<size_t>(config_.speculative.num_tokens), 0);
  const int64_t pool_tokens = int64_t{config_.num_blocks} * config_.block_size;
  max_len_ = static_cast<int>(std::min<int64_t>(config_.max_model_len, pool_tokens));
  if (!config_.chunked_prefill) max_len_ = std::min(max_len_, config_.max_num_batched_tokens);
  running_.reserve(static_cast<size_t>(config_.max_num_seqs));
}

RequestLimits Scheduler::request_limits() const {
  RequestLimits l;
  l.max_model_len = config_.max_model_len;
  l.max_sequence_len = max_len_;
  l.block_size = config_.block_size;
  l.num_blocks = config_.num_blocks;
  l.chunked_prefill = config_.chunked_prefill;
  l.max_num_batched_tokens = config_.max_num_batched_tokens;
  return l;
}

SamplingParams Scheduler::choice_sampling(const Request& request, SeqId seq) {
  SamplingParams s = request.choice_sampling(choice_of(seq));
  if (!s.seed && s.temperature > 0.0f) s.seed = default_seed(seq);
  return s;
}

Status Scheduler::add_request(RequestId id, std::shared_ptr<const Request> request) {
  TESSERA_CHECK(request != nullptr) << request_name(id);
  if (id == 0 || id > kMaxRequestId)
    return invalid_argument(request_name(id) + ": ids must be in [1, " + std::to_string(kMaxRequestId) + "]");
  if (entries_.count(id)) return invalid_argument(request_name(id) + ": id already in use");
  if (Status st = validate_request(*request, request_limits()); !st.is_ok())
    return invalid_argument(request_name(id) + ": " + st.message());
  SamplingParams sampling = choice_sampling(*request, id);
  auto entry = std::make_unique<Entry>(Sequence(id, std::move(request), std::move(sampling), next_arrival_++));
  Entry& e = *entry;
  waiting_.insert(entry.get());
  entries_.emplace(id, std::move(entry));
  // A constrained request's first mask: from the grammar's cache, else on the warmer while the
  // request waits and its prompt is computed (all but the last prompt token, which samples).
  // A grammar's first walk never runs on the engine thread: it may take seconds (and cannot
  // be cut short), and the warmer learns from it whether the grammar is costly.
  if (config_.structured_mask_budget_ms > 0 && e.seq.is_constrained() && !e.seq.take_cached_token_mask()) defer_mask(e);
  return Status::ok();
}

void Scheduler::fork(Entry& parent, StepPlan& plan) {
  const Sequence& p = parent.seq;
  for (int c = 1; c < p.request().n; ++c) {
    const SeqId child_id = choice_seq_id(p.request_id(), c);
    TESSERA_CHECK(entries_.count(child_id) == 0) << "sequence " << child_id << " exists before its fork";
    auto entry = std::make_unique<Entry>(p.fork(child_id, choice_sampling(p.request(), child_id)));
    Entry* e = entry.get();
    entries_.emplace(child_id, std::move(entry));
    if (parent.batch_member) {  // static batching: the batch lasts until every choice ends
      e->batch_member = true;
      ++static_members_left_;
    }
    if (static_cast<int>(running_.size()) < config_.max_num_seqs) {
      // Shares every block of the parent's table, which now covers the whole prompt: the
      // parent's step writes them, and the child samples from that step's logits.
      blocks_.fork(p.id(), child_id);
      running_.insert(std::upper_bound(running_.begin(), running_.end(), e, RunsBefore{}), e);
      add_step(*e, 0, plan, p.id());
    } else {
      // No room to run beside its parent: it queues like a new sequence, owning nothing, and
      // starts from the prefix cache (the parent's filed prompt blocks) when admitted.
      e->seq.preempt();
      waiting_.insert(e);
    }
  }
  parent.seq.forked();
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.step_id = next_step_id_;
  if (has_work()) {
    plan.seqs.reserve(std::min<size_t>(running_.size() + waiting_.size(), static_cast<size_t>(config_.max_num_seqs)));
    int budget = config_.max_num_batched_tokens;
    const int decodes = schedule_decodes(plan, budget);
    int prefill_budget = budget;
    prefill_token_cap_ = 0;
    bool tpot_bound = false;
    if (const std::optional<int> cap = prefill_cap(decodes, &tpot_bound); cap && *cap < prefill_budget) {
      prefill_budget = *cap;
      prefill_token_cap_ = *cap;
      ++prefill_capped_steps_;
      if (tpot_bound) ++tpot_capped_steps_;
    }
    const int prefill_offered = prefill_budget;
    prompt_rows_left_ = kPromptLogprobRowsPerStep;
    schedule_prefills(plan, prefill_budget);
    admit_waiting(plan, prefill_budget);
    last_plan_.step_id = plan.step_id;
    last_plan_.decodes = decodes;
    last_plan_.prefill_tokens = prefill_offered - prefill_budget;
    last_plan_.timed = false;
    last_plan_.decode_ids.clear();
    if (config_.max_tpot_slowdown > 0) {
      for (const Entry* e : step_decodes_) last_plan_.decode_ids.push_back(e->seq.id());
    }
  }
  take_lora_changes(plan);
  // Drops ride on the next plan that runs (an empty plan is not sent).
  if (!plan.seqs.empty() || !plan.block_copies.empty() || !plan.lora_loads.empty() || !plan.lora_unloads.empty()) {
    plan.dropped = std::move(dropped_);
    dropped_.clear();
  }
  ++next_step_id_;
  return plan;
}

void Scheduler::on_step_time(uint64_t step_id, double seconds, double interval) {
  if (last_plan_.timed || last_plan_.step_id != step_id) return;
  last_plan_.timed = true;
  cost_model_.observe(last_plan_.decodes, last_plan_.prefill_tokens, seconds);
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  recent_step_seconds_ = recent_step_seconds_ == 0 ? seconds : recent_step_seconds_ + (seconds - recent_step_seconds_) / 8;
  // The gap beside the executor's time: at 8 requests/s on 2 cores the coordinator's HTTP
  // streams, new prompts' tokenization and the clients share the cores with the workers, and
  // a stream's time per token is the interval, not the executor's part of it.
  if (std::isfinite(interval) && interval >= seconds) {
    constexpr double kGapWeight = 1.0 / 16;  // about the last 16 steps
    step_gap_ += kGapWeight * ((interval - seconds) - step_gap_);
  } else {
    interval = seconds;
  }
  for (const SeqId id : last_plan_.decode_ids) {
    if (const auto it = entries_.find(id); it != entries_.end()) {
      it->second->decode_steps += 1;
      it->second->decode_seconds += interval;
    }
  }
}

namespace {
// How many of a stream's next steps max_tpot_slowdown may borrow the predicted savings of.
// 16: on the ~100M model on 2 cores (lone step ~7.5 ms, target 1.75×) a stream that has just
// started then lends ~90 ms, more than a whole 128-token prompt's step; 32 measured no better
// at 1 request/s, and 64 let p50 time per token at 8 requests/s reach 51 ms.
constexpr int kTpotHorizonSteps = 16;
}  // namespace

bool Scheduler::tpot_admits(int sequences) const {
  // Prompts fed slowly still become decodes: the prefill cap alone lets a burst of arrivals,
  // admitted in steps without decodes, decode together in steps slower than the target, where
  // no cap can help. So a sequence starts only while that many decoding alone are predicted
  // to stay within it; the rest wait (their time to first token grows, not every stream's
  // time per token).
  if (!(config_.max_tpot_slowdown > 1) || !latency_budgets_apply()) return true;
  const std::optional<double> lone = cost_model_.lone_decode_seconds();
  if (!lone) return true;
  const std::optional<double> together = cost_model_.decodes_alone_seconds(sequences);
  return !together || *together + step_gap_ <= config_.max_tpot_slowdown * *lone;
}

std::optional<int> Scheduler::prefill_cap(int decodes, bool* tpot_bound) const {
  // Prompt tokens beside running decodes slow every one of those streams.
  *tpot_bound = false;
  if (decodes == 0 || !latency_budgets_apply()) return std::nullopt;
  // Each step within max_decode_slowdown × its decodes alone: bounds any one token's delay.
  std::optional<int> cap;
  if (config_.max_decode_slowdown > 1) cap = cost_model_.prefill_cap(decodes, config_.max_decode_slowdown);
  // Each decode's mean time per token within max_tpot_slowdown × a lone decode step: bounds
  // what a stream averages when prompts keep arriving. A stream's credit is what its steps so
  // far saved against the target, plus what its next steps are predicted to save if they
  // carry only the current decodes (up to kTpotHorizonSteps of them, and no more than it has
  // tokens left to make): so at light load, where a step of decodes alone is far under the
  // target, a prompt arriving beside a stream that has just started still goes whole, and
  // under load, where the decodes alone approach the target, prompts are fed only as fast as
  // the streams' savings allow. If later steps turn out slower than predicted (more streams
  // join), a stream's mean ends at most horizon × slack / (tokens − 1) above the target.
  // Credit and target are in intervals between tokens (on_step_time), so a step is predicted
  // as its executor time plus the recent gap between steps.
  const std::optional<double> lone = cost_model_.lone_decode_seconds();
  if (config_.max_tpot_slowdown > 1 && lone) {
    const double target = config_.max_tpot_slowdown * *lone;
    const double slack =
        std::max(0.0, target - step_gap_ - cost_model_.decodes_alone_seconds(decodes).value_or(target));
    double allowed = std::numeric_limits<double>::infinity();
    for (const Entry* e : step_decodes_) {
      const int ahead = std::clamp(e->seq.max_new_tokens() - e->seq.num_output() - 1, 0, kTpotHorizonSteps);
      allowed = std::min(allowed, target * (e->decode_steps + 1) - e->decode_seconds + ahead * slack);
    }
    // A step within the target moves no stream's mean further above it, so it is always
    // allowed, even to a stream a stall has put in debt: otherwise one slow step (a host
    // hiccup) fed the prompt beside it one token per step until the debt was repaid
    // (measured: the last 14 tokens of a 128-token prompt over 14 steps, +110 ms to its TTFT).
    allowed = std::max(allowed, target);
    if (const std::optional<int> tpot = cost_model_.prefill_tokens_within(decodes, allowed - step_gap_);
        tpot && (!cap || *tpot < *cap)) {
      cap = tpot;
      *tpot_bound = true;
    }
  }
  return cap;
}

int Scheduler::schedule_decodes(StepPlan& plan, int& budget) {
  // Decodes first: one token each, the cheapest way to keep every stream moving.
  step_decodes_.clear();
  // (Read by the speculation depth only.)
  step_decoding_ = !proposer_ ? 0 : static_cast<int>(std::count_if(running_.begin(), running_.end(), [](const Entry* e) {
    return e->seq.state() == SequenceState::kDecode && !e->mask_deferred;
  }));
  step_proposal_rows_ = 0;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Entry& e = *running_[i];
    if (e.seq.state() != SequenceState::kDecode || e.mask_deferred) {
      ++i;
      continue;
    }
    const int from = e.seq.num_computed();
    // Proposals ride along only where the pool has room for them as it is: they never
    // preempt anyone.
    std::vector<int32_t> draft = proposals_for(e, budget - 1);
    if (!draft.empty()) {
      const int end = from + 1 + static_cast<int>(draft.size());
      if (!blocks_.append_slots(e.seq.id(), from, end, &plan.block_copies)) draft.clear();
    }
    if (draft.empty() && !blocks_.append_slots(e.seq.id(), from, from + 1, &plan.block_copies)) {
      if (!make_room(e, from, from + 1)) {
        preempt(e);  // it is the newest unscheduled one: running_[i] is now the next
        continue;
      }
      TESSERA_CHECK(blocks_.append_slots(e.seq.id(), from, from + 1, &plan.block_copies));
    }
    const int propose = ask_executor_proposals(e, from + 1 + static_cast<int>(draft.size()), plan);
    add_step(e, 1, plan, 0, draft, propose);
    budget -= 1 + static_cast<int>(draft.size());
    // The rows the depths chosen so far add: this step's proposals by lookup, or the ones the
    // executors' draft is asked for (the next step's, the depth being chosen one step ahead).
    step_proposal_rows_ += propose > 0 ? propose : static_cast<int>(draft.size());
    step_decodes_.push_back(&e);
    ++i;
  }
  return static_cast<int>(step_decodes_.size());
}

void Scheduler::schedule_prefills(StepPlan& plan, int& budget) {
  // The next chunk of every prefill in progress.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Entry& e = *running_[i];
    // (A choice forked in this plan is already in it: it samples from its parent's step.)
    if (e.seq.state() != SequenceState::kPrefill || scheduled_now(e)) continue;
    const int remaining = e.seq.num_tokens() - e.seq.num_computed();
    const int from = e.seq.num_computed();
    int chunk = chunk_within_prompt_rows(e, from, chunk_before_mask(e, remaining, std::min(remaining, budget)));
    if (chunk == 0) continue;
    if (!config_.chunked_prefill && chunk < remaining) continue;  // waits for a step with room
    const SeqId id = e.seq.id();
    if (!blocks_.append_slots(id, from, from + chunk, &plan.block_copies)) {
      // Prefer a shorter chunk to preempting anyone; preempt only when nothing fits.
      int fits = config_.chunked_prefill ? blocks_.max_appendable_tokens(id, from) : 0;
      if (fits == 0 && make_room(e, from, from + chunk)) fits = chunk;
      if (fits == 0 && config_.chunked_prefill) fits = blocks_.max_appendable_tokens(id, from);
      chunk = std::min(chunk, fits);
      if (chunk == 0) continue;
      TESSERA_CHECK(blocks_.append_slots(id, from, from + chunk, &plan.block_copies));
    }
    take_prompt_rows(e, from, chunk);
    add_step(e, chunk, plan, 0, {}, ask_executor_proposals(e, from + chunk, plan));
    budget -= chunk;
  }
}

namespace {
// The prompt-logprob rows a chunk of `seq` from position `from` computes: one for each of
// positions from .. prompt_len - 2 (the last prompt token's row samples instead); none
// without prompt logprobs.
int prompt_logprob_rows(const Sequence& seq, int from, int chunk) {
  return seq.sampling().prompt_logprobs < 0 ? 0 : std::clamp(seq.prompt_len() - 1 - from, 0, chunk);
}
}  // namespace

int Scheduler::chunk_within_prompt_rows(const Entry& e, int from, int chunk) const {
  if (!config_.chunked_prefill || config_.mode != BatchingMode::kContinuous) return chunk;
  return prompt_logprob_rows(e.seq, from, chunk) <= prompt_rows_left_ ? chunk : prompt_rows_left_;
}

void Scheduler::take_prompt_rows(const Entry& e, int from, int chunk) {
  prompt_rows_left_ -= prompt_logprob_rows(e.seq, from, chunk);
}

bool Scheduler::make_room(Entry& e, int write_from, int end) {
  while (blocks_.append_cost(e.seq.id(), write_from, end) > blocks_.num_free_blocks()) {
    // The newest (lowest-priority) running sequence not already in this plan, if it runs
    // after `e`; scheduled ones keep their blocks because the plan already lists them.
    Entry* victim = nullptr;
    for (size_t j = running_.size(); j-- > 0;) {
      Entry* cand = running_[j];
      if (cand == &e) break;
      if (!scheduled_now(*cand)) {
        victim = cand;
        break;
      }
    }
    if (victim == nullptr) return false;
    preempt(*victim);
  }
  return true;
}

void Scheduler::admit_waiting(StepPlan& plan, int& budget) {
  const bool is_static = config_.mode == BatchingMode::kStatic;
  // Static batching forms a batch only when the previous one has completely finished.
  const bool forming = is_static && static_members_left_ == 0;
  // Sequences waiting for a costly grammar's mask on the warmer sit out the steps (seconds at
  // a time): they do not slow the others, so the time-per-token budget does not count them.
  int paced = static_cast<int>(std::count_if(running_.begin(), running_.end(), [](const Entry* r) { return !r->mask_deferred; }));
  LoraAdmission loras = lora_admission();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (static_cast<int>(running_.size()) >= config_.max_num_seqs) break;
    if (!is_static && budget == 0) break;
    if (!is_static && paced > 0 && !tpot_admits(paced + 1)) break;
    Entry& e = **it;
    if (is_static && !forming && !e.batch_member) {
      ++it;  // not part of the running batch: waits for the next one
      continue;
    }
    if (e.mask_deferred && (is_static || !config_.chunked_prefill)) {
      ++it;  // its first mask is still being computed: the others go first
      continue;
    }
    if (!admits_lora(loras, e.seq.request().lora)) {
      ++it;  // its adapter would be one too many running (max_loras)
      continue;
    }
    const SeqId id = e.seq.id();
    const std::span<const int32_t> tokens = e.seq.token_ids();
    const int len = e.seq.num_tokens();
    // A sequence asking prompt logprobs computes its whole prompt: a cached prefix has no
    // logits; nor hidden states, which mean and CLS pooling read (last pooling reads only the
    // last row, which is always computed).
    const Pooling pooling = e.seq.request().pooling;
    const bool whole_prompt =
        e.seq.sampling().prompt_logprobs >= 0 || pooling == Pooling::kMean || pooling == Pooling::kCls;
    // Prefixes are shared only between sequences of the same adapter (or of the base).
    const uint64_t root = prefix_root(e.seq.request().lora);
    PrefixHit hit = whole_prompt ? PrefixHit{{}, 0, root, root} : blocks_.find_cached_prefix(tokens, root);
    // At least one token is computed, so the step yields logits to sample from.
    const int cached = std::min(hit.num_tokens(config_.block_size), len - 1);
    const int remaining = len - cached;
    int chunk = chunk_before_mask(e, remaining, std::min(remaining, budget));
    if (chunk == 0) {
      ++it;  // only its last prompt token is left, and that one samples: it waits for its mask
      continue;
    }
    chunk = chunk_within_prompt_rows(e, cached, chunk);
    if (chunk == 0) {
      ++it;  // the step's prompt-logprob rows are taken: it starts in the next
      continue;
    }
    if (!config_.chunked_prefill && chunk < remaining) {
      if (!is_static) break;  // FCFS: the head waits for a step with room for its prompt
      chunk = 0;
    }
    // Static members reserve their whole prompt up front: they are all in until the end.
    const int reserve_end = is_static ? len : cached + chunk;
    const int first_key = first_needed_key(cached);
    if (blocks_.admission_cost(hit, cached, reserve_end, first_key) > blocks_.num_free_blocks()) break;
    blocks_.admit(id, hit, cached);
    prefix_query_tokens_ += static_cast<uint64_t>(len);  // what was looked up; `cached` of it hit
    // A long cached prefix may lie partly before the window: those hits go straight back
    // (to the prefix cache's recent end), before anything new is allocated.
    blocks_.release_blocks_before(id, first_key);
    TESSERA_CHECK(blocks_.append_slots(id, cached, reserve_end, &plan.block_copies));
    it = waiting_.erase(it);
    e.seq.start(cached);
    e.pooled_sum.clear();  // a resumed embedding pools its prompt again
    e.pooled_rows = 0;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), &e, RunsBefore{}), &e);
    if (config_.max_loras > 0) loras.running.insert(e.seq.request().lora);
    ++paced;
    if (forming) {
      e.batch_member = true;
      ++static_members_left_;
    }
    if (chunk > 0) {
      take_prompt_rows(e, cached, chunk);
      add_step(e, chunk, plan, 0, {}, ask_executor_proposals(e, cached + chunk, plan));
      budget -= chunk;
    }
  }
}

void Scheduler::add_step(Entry& e, int num_tokens, StepPlan& plan, SeqId sample_from, std::span<const int32_t> draft,
                         int propose) {
  const Sequence& seq = e.seq;
  TESSERA_CHECK(num_tokens > 0 || sample_from != 0) << "sequence " << seq.id() << ": a step feeds tokens";
  const int from = seq.num_computed();
  const std::span<const int32_t> tokens = seq.token_ids();
  SeqStep& s = plan.seqs.emplace_back();
  s.seq_id = seq.id();
  s.tokens.assign(tokens.begin() + from, tokens.begin() + from + num_tokens);
  s.num_computed = from;
  // An embedding sequence never samples: its last chunk ends it (on_step_result).
  s.sample = from + num_tokens == seq.num_tokens() && seq.request().pooling == Pooling::kNone;
  TESSERA_CHECK(draft.empty() || s.sample) << "sequence " << seq.id() << ": proposals follow the last known token";
  s.tokens.insert(s.tokens.end(), draft.begin(), draft.end());
  s.num_draft = static_cast<int32_t>(draft.size());
  s.propose = s.sample ? propose : 0;
  e.draft_in_flight = s.num_draft + s.propose;
  if (s.sample) {
    if (const std::vector<uint32_t>* mask = e.seq.next_token_mask()) {
      // With proposals, a mask per checked row, all of one length (SeqStep::allowed_tokens).
      TESSERA_CHECK(e.proposal_masks.size() >= static_cast<size_t>(s.num_draft))
          << "sequence " << seq.id() << ": " << s.num_draft << " proposals, " << e.proposal_masks.size() << " masks";
      const std::span<const std::vector<uint32_t>> after(e.proposal_masks.data(), static_cast<size_t>(s.num_draft));
      size_t words = mask->size();
      for (const auto& m : after) words = std::max(words, m.size());
      s.allowed_tokens.assign(words * (after.size() + 1), 0);
      std::copy(mask->begin(), mask->end(), s.allowed_tokens.begin());
      for (size_t i = 0; i < after.size(); ++i)
        std::copy(after[i].begin(), after[i].end(), s.allowed_tokens.begin() + static_cast<std::ptrdiff_t>((i + 1) * words));
    }
  }
  // Only the block-table entries the executors do not hold yet travel: a step writes from
  // `from` on, so entries before from / block_size never change again (a sliding window
  // only turns leading ones into -1, which num_released says; sent_table need not follow,
  // since those entries lie before from / block_size and are never compared).
  const std::vector<int32_t>& table = blocks_.block_table(seq.id());
  s.num_released = static_cast<int32_t>(table.size()) - blocks_.num_held_blocks(seq.id());
  if (e.version == 0) {
    SeqStart& start = s.start.emplace();
    start.sampling = seq.sampling();
    start.prompt_len = seq.prompt_len();
    if (seq.sampling().has_penalty()) start.history.assign(tokens.begin(), tokens.begin() + from);
    if (seq.sampling().prompt_logprobs >= 0) start.prompt.assign(tokens.begin(), tokens.begin() + seq.prompt_len());
    start.sample_from = sample_from;
    start.pooling = seq.request().pooling;
    start.lora = seq.request().lora;
    s.table_from = 0;
  } else {
    // (The table may be shorter than what was sent: the blocks of rejected proposals went back.)
    size_t first = std::min({e.sent_table.size(), table.size(), static_cast<size_t>(from / config_.block_size)});
    while (first < e.sent_table.size() && first < table.size() && e.sent_table[first] == table[first]) ++first;
    s.table_from = static_cast<int32_t>(first);
  }
  s.new_blocks.assign(table.begin() + s.table_from, table.end());
  e.sent_table.resize(static_cast<size_t>(s.table_from));
  e.sent_table.insert(e.sent_table.end(), s.new_blocks.begin(), s.new_blocks.end());
  s.version = ++e.version;
  e.scheduled_step = plan.step_id + 1;
  // The step computing the rest of the prompt of a request with n > 1 forks it (`s` is not
  // used again: the children's steps are appended to the plan).
  if (s.sample && e.seq.fork_pending()) fork(e, plan);
}

void Scheduler::forget_on_executors(Entry& e) {
  if (e.version == 0) return;
  dropped_.push_back(e.seq.id());
  e.version = 0;
  e.sent_table.clear();
}

void Scheduler::preempt(Entry& e) {
  forget_on_executors(e);  // resumed, it is sent in full again
  blocks_.free(e.seq.id());
  remove_running(e);
  e.seq.preempt();
  waiting_.insert(&e);  // its arrival puts it ahead of everything that came later
  ++num_preemptions_;
}

void Scheduler::on_kv_cache_lost() {
  while (!running_.empty()) preempt(*running_.back());
  blocks_.forget_cached_contents();
  resend_runtime_loras();  // restarted executors hold only the adapters of their configuration
}

void Scheduler::remove_running(const Entry& e) {
  auto it = std::lower_bound(running_.begin(), running_.end(), &e, RunsBefore{});
  TESSERA_CHECK(it != running_.end() && *it == &e) << "sequence " << e.seq.id() << " is not running";
  running_.erase(it);
}

void Scheduler::end_sequence(Entry& e, SequenceEvent& event, FinishReason reason) {
  // A sequence whose grammar or stop condition ended it: its event says so and it leaves.
  finish(e, reason);
  event.finished = true;
  event.reason = reason;
  entries_.erase(e.seq.id());
}

void Scheduler::finish(Entry& e, FinishReason reason) {
  forget_on_executors(e);
  if (e.seq.is_running()) {
    blocks_.free(e.seq.id());
    remove_running(e);
  } else if (e.seq.state() == SequenceState::kWaiting) {
    waiting_.erase(&e);
  }
  if (e.batch_member) {
    e.batch_member = false;
    --static_members_left_;
  }
  e.seq.finish(reason);
}

bool Scheduler::abort(RequestId id) {
  bool any = false;  // choice 0 may have finished while forked choices still run
  for (int c = 0; c < kMaxChoices; ++c) any |= abort_choice(id, c);
  return any;
}

bool Scheduler::abort_choice(RequestId id, int choice) {
  auto it = entries_.find(choice_seq_id(id, choice));
  if (it == entries_.end()) return false;
  finish(*it->second, FinishReason::kAborted);
  entries_.erase(it);
  return true;
}

const Sequence* Scheduler::find(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second->seq;
}

SchedulerStats Scheduler::stats() const {
  const BlockManagerStats b = blocks_.stats();
  SchedulerStats s;
  s.num_running = static_cast<int>(running_.size());
  s.num_waiting = static_cast<int>(waiting_.size());
  // Requests, not choices, as vLLM's num_requests_running counts them.
  std::vector<RequestId> requests;
  requests.reserve(running_.size());
  for (const Entry* e : running_) requests.push_back(request_of(e->seq.id()));
  std::sort(requests.begin(), requests.end());
  s.num_running_requests = static_cast<int>(std::unique(requests.begin(), requests.end()) - requests.begin());
  for (const Entry* e : waiting_) s.num_waiting_requests += choice_of(e->seq.id()) == 0 ? 1 : 0;
  s.num_free_blocks = b.num_free;
  s.num_cached_blocks = b.num_cached;
  s.num_blocks = b.num_blocks;
  s.num_steps = next_step_id_;
  s.num_preemptions = num_preemptions_;
  s.prefix_hit_tokens = b.prefix_hit_tokens;
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_blocks = b.prefix_hit_blocks;
  s.cow_copies = b.cow_copies;
  s.prefill_token_cap = prefill_token_cap_;
  s.tpot_capped_steps = tpot_capped_steps_;
  s.deferred_masks = deferred_masks_total_;
  s.prefill_capped_steps = prefill_capped_steps_;
  s.window_releases = b.window_releases;
  s.spec = spec_stats_;
  for (const Entry* e : running_)
    if (!e->seq.request().lora.empty()) s.running_lora.insert(e->seq.request().lora);
  for (const Entry* e : waiting_)
    if (!e->seq.request().lora.empty()) s.waiting_lora.insert(e->seq.request().lora);
  return s;
}

void Scheduler::check_invariants() const {
  blocks_.check_invariants();
  TESSERA_CHECK_LE(static_cast<int>(running_.size()), config_.max_num_seqs);
  TESSERA_CHECK_EQ(entries_.size(), running_.size() + waiting_.size());
  TESSERA_CHECK_EQ(blocks_.stats().num_sequences, static_cast<int>(running_.size()))
      << "block tables held by sequences that are not running";
  int members = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Entry& e = *running_[i];
    const Sequence& s = e.seq;
    if (i > 0) TESSERA_CHECK(running_[i - 1]->seq.runs_before(s)) << "running list out of order at " << s.id();
    TESSERA_CHECK(s.is_running()) << "sequence " << s.id() << " in running list while " << sequence_state_name(s.state());
    TESSERA_CHECK(blocks_.has_sequence(s.id())) << "running sequence " << s.id() << " has no block table";
    const int table = static_cast<int>(blocks_.block_table(s.id()).size());
    TESSERA_CHECK_GE(table * config_.block_size, s.num_computed()) << "sequence " << s.id() << " KV not covered";
    TESSERA_CHECK_LE(table, blocks_.blocks_needed(s.num_tokens() + e.draft_in_flight))
        << "sequence " << s.id() << " over-allocated";
    TESSERA_CHECK_EQ(table - blocks_.num_held_blocks(s.id()), first_needed_key(s.num_computed()) / config_.block_size)
        << "sequence " << s.id() << " holds blocks its window has left, or lost ones it reads";
    TESSERA_CHECK_GE(s.num_uncomputed(), 1) << "sequence " << s.id();
    if (s.state() == SequenceState::kDecode) TESSERA_CHECK_EQ(s.num_uncomputed(), 1) << "decode sequence " << s.id();
    // (An embedding's input may take the whole context: it generates nothing.)
    TESSERA_CHECK_LT(s.num_tokens(), max_len_ + (s.request().pooling != Pooling::kNone ? 1 : 0))
        << "sequence " << s.id() << " should have finished";
    TESSERA_CHECK_LT(s.num_output(), s.max_new_tokens()) << "sequence " << s.id() << " should have finished";
    members += e.batch_member;
    if (config_.mode == BatchingMode::kStatic) TESSERA_CHECK(e.batch_member) << "non-member " << s.id() << " runs";
  }
  for (const Entry* e : waiting_) {
    TESSERA_CHECK(e->seq.state() == SequenceState::kWaiting) << "sequence " << e->seq.id() << " queued while "
                                                             << sequence_state_name(e->seq.state());
    TESSERA_CHECK(!blocks_.has_sequence(e->seq.id())) << "waiting sequence " << e->seq.id() << " holds blocks";
    TESSERA_CHECK_EQ(e->seq.num_computed(), 0);
    members += e->batch_member;
  }
  TESSERA_CHECK_EQ(members, static_members_left_);
}

}  // namespace tessera
