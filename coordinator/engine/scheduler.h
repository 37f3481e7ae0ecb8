#pragma once
// Iteration-level (continuous) batching over the paged KV cache. Each schedule() builds one
// StepPlan under a token budget:
//   1. running decodes, one token each (oldest first);
//   2. running prefills, the next chunk of each (chunked prefill);
//   3. waiting requests by (priority, arrival), starting where the prefix cache leaves off.
// When a running sequence needs a block and none is free, the newest unscheduled running
// sequence (lowest priority first) is preempted by recompute: its blocks are freed and it
// goes back to the waiting queue, keeping its output, to be prefilled again as prompt +
// output. on_step_result() appends the sampled tokens, applies stop conditions and frees
// the blocks of finished sequences.
//
// With a sliding window W (every layer of the model attends to at most the last W keys), the
// next step of a sequence that has computed n tokens reads no key before n - W + 1 (its first
// new token is the oldest query), and n never decreases while it runs. So after admission and
// after every step each running sequence gives back the blocks wholly before that key, and
// holds at most ceil((W - 1 + c - 1) / block_size) + 1 blocks during a step that writes c
// tokens: ceil((W - 1) / block_size) + 1 <= ceil(W / block_size) + 1 while decoding.
//
// The scheduler never calls model code and is not thread-safe: the engine loop calls
// add_request / abort / schedule / on_step_result from one thread.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/parallel_roles.h"
#include "common/status.h"
#include "common/step_plan.h"
#include "coordinator/engine/block_manager.h"
#include "coordinator/engine/proposer.h"
#include "coordinator/engine/row_cost_curve.h"
#include "coordinator/engine/speculation_depth.h"
#include "coordinator/engine/request.h"
#include "coordinator/engine/sequence.h"
#include "coordinator/engine/step_cost_model.h"
#include "coordinator/engine/structured/mask_pool.h"
#include "coordinator/engine/structured/mask_warmer.h"

namespace tessera {

struct SchedulerConfig {
  int block_size = 16;
  int num_blocks = 1024;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 4096;
  bool chunked_prefill = true;
  bool prefix_caching = true;
  int max_model_len = 4096;  // prompt + output
  BatchingMode mode = BatchingMode::kContinuous;
  // > 0: the model's every layer attends to at most this many latest keys
  // (ModelConfig::kv_window()), so blocks that fall wholly out of it are freed. 0: never.
  int sliding_window = 0;
  // > 1: while sequences decode, the prompt tokens a step adds beside them (running prefills'
  // chunks and admissions) are capped so the step is predicted to take at most this many
  // times those decodes alone (StepCostModel, fitted from the step times the engine reports
  // through on_step_time); chunked prefill and continuous mode only. 0: no cap, prompts take
  // whatever budget the decodes leave. The YAML default is 0 as well (docs/configuration.md).
  double max_decode_slowdown = 0;
  // > 1: keeps every running sequence's mean step time per generated token (over the steps
  // it decoded in, as timed through on_step_time) within this many times a lone decode step
  // (the StepCostModel's a + b), the "target". Two rules: a sequence is admitted only while
  // the running ones plus it, all decoding, are predicted to take at most the target; and the
  // prompt tokens a step adds beside decodes are capped by the smallest credit among them, a
  // credit being target × (its decode steps + 1) − the time those took + what its next steps
  // (up to 16) are predicted to save at the current decodes. Bounds time per output token
  // under load, where max_decode_slowdown bounds each step against its own decodes. Same
  // conditions as max_decode_slowdown. 0: off. YAML default in docs/scheduler.md.
  double max_tpot_slowdown = 0;
  // Speculative decoding (coordinator/engine/proposer.h): decoding sequences feed up to
  // num_tokens proposals after their last token, checked in the same step; the tokens are
  // those decoding one by one would give. Not for constrained sequences (structured output).
  SpeculativeConfig speculative;
  // Measured, not configured: a plain step's time by its rows (measure_row_costs, at start-up
  // where speculation is on). What a proposal's verification row costs is read from it, so
  // speculation backs off as steps turn compute-bound. Empty: verification rows count as free.
  RowCostCurve row_costs;
  // > 0: the engine time (ms) one step spends on structured-output masks; a sequence whose mask
  // is not done by then sits out the steps until it is (advance_deferred_masks goes on with
  // it), so a costly grammar slows only its own sequence. 0: every step waits for every mask.
  int structured_mask_budget_ms = 0;
  // > 0: the running sequences name at most this many LoRA adapters (lora.max_loras, the
  // executors' resident ones): a waiting sequence of another adapter is passed over, and the
  // ones behind it (the base's, the running adapters') go first. 0: no limit.
  int max_loras = 0;
};

// A user-reachable config is checked here (each bad field named) before it reaches the
// Scheduler constructor, which only TESSERA_CHECKs it.
Status validate_scheduler_config(const SchedulerConfig& config);

// What one step did to one sequence.
struct SequenceEvent {
  SeqId seq_id = 0;
  // Appended this step: one, or with speculative decoding up to the proposals + 1.
  std::vector<SampledToken> new_tokens;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;                     // for kError
  // Prompt logprobs computed this step (a sequence asking them, coordinator/engine/request.h); an
  // event may carry only these (a prefill chunk samples nothing). A recomputed prompt
  // (preemption) sends positions again, with the same values.
  std::vector<PromptLogprob> prompt_logprobs;
  // An embedding request's one event (finished, kStop): its pooled final hidden state — the
  // mean of the rows, or the last or first row, as its pooling says; not normalised.
  std::vector<float> embedding;
};

// Speculative decoding, vLLM's spec_decode counters.
struct SpecDecodeStats {
  uint64_t num_drafts = 0;           // sequence steps that carried proposals
  uint64_t num_draft_tokens = 0;     // proposals
  uint64_t num_accepted_tokens = 0;  // of those, accepted
  std::vector<uint64_t> accepted_per_pos;  // index i: proposal i + 1 accepted
};

struct SchedulerStats {
  int num_running = 0;
  int num_waiting = 0;            // sequences (choices) waiting
  int num_running_requests = 0;   // requests with at least one running sequence
  // Requests waiting: those whose first choice waits (not yet started, or preempted); the
  // forked choices of a request that runs do not count (server.max_queued_requests).
  int num_waiting_requests = 0;
  int num_free_blocks = 0;   // free + cached-evictable
  int num_cached_blocks = 0;
  int num_blocks = 0;
  uint64_t num_steps = 0;
  uint64_t num_preemptions = 0;
  uint64_t prefix_hit_tokens = 0;  // prompt tokens not recomputed thanks to the prefix cache
  uint64_t prefix_query_tokens = 0;  // tokens of admitted sequences looked up in the prefix cache
  uint64_t prefix_hit_blocks = 0;
  uint64_t cow_copies = 0;
  uint64_t window_releases = 0;  // blocks freed because the sliding window moved past them
  // The cap max_decode_slowdown put on the last step's prompt tokens (0: none applied), and
  // how many steps had one.
  int prefill_token_cap = 0;
  uint64_t prefill_capped_steps = 0;
  // Of those, the steps where max_tpot_slowdown's cap was the tighter one.
  uint64_t tpot_capped_steps = 0;
  // Structured-output masks that outran a step's budget (structured_mask_budget_ms): each
  // time, the sequence sat out steps while the others went on.
  uint64_t deferred_masks = 0;
  SpecDecodeStats spec;
  // LoRA adapters (Request::lora) of the running and of the waiting sequences, by name.
  std::set<std::string> running_lora, waiting_lora;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request under `id` (its choice 0 is sequence `id`, choice c is
  // choice_seq_id(id, c)). InvalidArgument (naming the request) for a duplicate or
  // out-of-range id, or whatever validate_request() refuses: an empty prompt, max_tokens below
  // 1, n outside [1, kMaxChoices], bad sampling, or a prompt that could never run (prompt + 1
  // longer than max_model_len, more KV blocks than the whole pool, or without chunked prefill
  // more tokens than max_num_batched_tokens). An unseeded choice with temperature > 0 gets a
  // seed derived from its sequence id, so a preempted sequence resamples the same tokens.
  // With n > 1 the prompt is prefilled once and forked (see Sequence).
  Status add_request(RequestId id, std::shared_ptr<const Request> request);
  // What add_request checks a request against (the engine's side of validate_request).
  RequestLimits request_limits() const;

  // The next step. Empty (no seqs) when there is nothing to run.
  StepPlan schedule();
  // Applies the step's sampled tokens. A result with an error, or that does not match the
  // plan, finishes every sequence of the plan with kError.
  std::vector<SequenceEvent> on_step_result(const StepPlan& plan, const StepResult& result);
  // Takes up the masks that outran earlier steps' budget (structured_mask_budget_ms) once the
  // warmer has finished them (never waiting for one): each such sequence is scheduled again,
  // or ends (its event) when no token can continue its grammar. The engine calls it before
  // every schedule().
  std::vector<SequenceEvent> advance_deferred_masks();
  // How long the executor took for the plan `step_id` (the last one schedule() returned;
  // others are ignored): the data of the step cost model behind max_decode_slowdown.
  // `interval`, when the engine knows it: the time since the previous step ended, when
  // the two ran back to back (>= seconds): what the step's streams waited for their token,
  // the coordinator's own work between steps included. max_tpot_slowdown's credit is spent
  // in it; the cost model keeps the executor's seconds. Absent (< 0): the interval is the
  // executor's time.
  void on_step_time(uint64_t step_id, double seconds, double interval = -1.0);
  // The mean time between steps run back to back that is not the executor's (recent steps,
  // exponentially weighted); 0 until intervals are reported.
  double step_gap_seconds() const { return step_gap_; }
  const StepCostModel& step_cost_model() const { return cost_model_; }

  // Removes every waiting or running choice of a request and frees their blocks (a choice
  // not forked yet just never starts). False when none is live (e.g. all finished). Safe
  // between schedule() and on_step_result(): their results are dropped.
  bool abort(RequestId id);
  // The same for one choice (e.g. its stop string matched); the others go on.
  bool abort_choice(RequestId id, int choice);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // LoRA adapters loaded and dropped while serving: the next plan carries a load to the
  // executors; a drop rides on the first plan after no running or waiting sequence names the
  // adapter. Loads are remembered and sent again when the executors lose their state.
  void add_lora_load(const std::string& name, const std::string& dir);
  void add_lora_unload(const std::string& name);
  bool has_lora_changes() const { return !lora_loads_.empty() || !lora_unloads_.empty(); }
  // The executors' KV caches were lost (workers restarted): every running sequence is
  // preempted (recomputed from its tokens) and the prefix cache is emptied.
  void on_kv_cache_lost();
  SchedulerStats stats() const;
  // Whether a running or waiting sequence runs with the LoRA adapter `name`.
  bool uses_lora(const std::string& name) const;
  const SchedulerConfig& config() const { return config_; }
  // Longest prompt + output a sequence may reach: max_model_len capped by the KV pool (and
  // by the token budget without chunked prefill, since a preempted sequence must be
  // recomputed in one step then).
  int max_sequence_len() const { return max_len_; }
  const Sequence* find(SeqId id) const;  // live (waiting or running) sequences only
  const BlockManager& block_manager() const { return blocks_; }
  // TESSERA_CHECKs the block manager's invariants and the scheduler's accounting: waiting
  // sequences own no blocks, every running one's block table covers its computed tokens and
  // no more than its known tokens, states agree with counts, limits hold, and with a sliding
  // window it holds no block wholly before the oldest key its next step reads, and every other.
  void check_invariants() const;

 private:
  struct Entry {
    explicit Entry(Sequence seq) : seq(std::move(seq)) {}
    Sequence seq;
    uint64_t scheduled_step = 0;  // step_id + 1 of the last plan it was in (0 = never)
    bool batch_member = false;    // static mode: part of the current batch
    // What the executors hold for it (step deltas): the version of its last step (0 = no
    // state there: it is sent in full next), and the block table that step left them.
    uint32_t version = 0;
    std::vector<int32_t> sent_table;
    // The steps it decoded in and their timed seconds (max_tpot_slowdown's credit).
    int decode_steps = 0;
    double decode_seconds = 0;
    // Slots past its known tokens that its step in flight holds until the result comes: its
    // proposals', and the executors' draft's scratch (SeqStep::propose).
    int draft_in_flight = 0;
    // What the executors proposed after its last step (speculative.method draft), for the next.
    std::vector<int32_t> executor_proposals;
    AcceptanceEstimate acceptance;  // of its proposals so far
    int spec_rest = 0;              // steps backed off to depth 0 since the last probe
    // Its next structured-output mask outran a step's budget: it sits out steps while the
    // warmer computes the mask (warm: that job), until advance_deferred_masks takes it up.
    bool mask_deferred = false;
    std::shared_ptr<structured::WarmResult> warm;
    // Its grammar's step by one token outran a step's budget once: every later step of its
    // grammar goes to the warmer too.
    bool slow_grammar = false;
    // Proposals under its grammar (fit_proposals_to_grammar), for the step in flight: the
    // grammar's step by each proposal, and the mask of the row after each.
    std::vector<structured::ConstraintStep> proposal_steps;
    std::vector<std::vector<uint32_t>> proposal_masks;
    // An embedding sequence's pooled shares so far (StepResult::pooled), from its admission on.
    std::vector<double> pooled_sum;
    int pooled_rows = 0;
  };
  // A sequence of the step's result whose next mask is computed with the others (on_step_result).
  struct PendingMask {
    Entry* entry;
    size_t event;  // its index in the step's events
  };
  struct RunsBefore {
    bool operator()(const Entry* a, const Entry* b) const { return a->seq.runs_before(b->seq); }
  };

  bool scheduled_now(const Entry& e) const { return e.scheduled_step == next_step_id_ + 1; }
  // The oldest key position the next step of a sequence with `num_computed` tokens in the KV
  // cache can read (0 without a sliding window).
  int first_needed_key(int num_computed) const {
    return config_.sliding_window > 0 ? std::max(0, num_computed - config_.sliding_window + 1) : 0;
  }
  // Makes room for `e` to write [write_from, end) by preempting newer unscheduled running
  // sequences. False when only `e` itself is left to preempt.
  bool make_room(Entry& e, int write_from, int end);
  void preempt(Entry& e);
  // The running decodes, one token each, into step_decodes_; returns how many were scheduled.
  int schedule_decodes(StepPlan& plan, int& budget);
  // Without chunked prefill a prompt must go whole, and static batches admit no one mid-batch:
  // neither latency budget applies there.
  bool latency_budgets_apply() const {
    return config_.chunked_prefill && config_.mode == BatchingMode::kContinuous;
  }
  // The prompt tokens this step may add beside its `decodes` scheduled decodes (step_decodes_;
  // both latency budgets; nullopt: no cap). Sets tpot_bound when max_tpot_slowdown's cap is the tighter.
  std::optional<int> prefill_cap(int decodes, bool* tpot_bound) const;
  // Whether `sequences` running together, all decoding, fit max_tpot_slowdown's target (true
  // when it is off or the fit cannot say yet): admission stops short of that.
  bool tpot_admits(int sequences) const;
  void schedule_prefills(StepPlan& plan, int& budget);
  void admit_waiting(StepPlan& plan, int& budget);
  // Appends e's next step (`num_tokens` from its num_computed on, then `draft`: proposals) to
  // the plan; a forked choice's first step feeds none and samples from its parent's (`sample_from`).
  // `propose`: proposals the executors' draft makes after the step (SeqStep::propose).
  void add_step(Entry& e, int num_tokens, StepPlan& plan, SeqId sample_from = 0,
                std::span<const int32_t> draft = {}, int propose = 0);
  // With a proposer on the executors: how many proposals to ask of a step of `e` feeding up to
  // position `end` (0 unless it samples and speculates), after allocating the draft's scratch
  // slots [end, end + k) when the pool has room for them.
  int ask_executor_proposals(Entry& e, int end, StepPlan& plan);
  // The proposals for a decoding sequence's next step (at most `room`), empty when it does
  // not speculate.
  std::vector<int32_t> proposals_for(Entry& e, int room);
  // Whether proposals may ride on a sequence's steps: speculation on, the request not opting
  // out, no grammar that proved costly (those step one token at a time on the warmer), no
  // choices left to fork.
  bool may_speculate(const Entry& e) const;
  // Tokens the sequence may still output: the fewer of max_tokens and the room to max_len.
  int tokens_left(const Sequence& seq) const;
  // Speculation depth per sequence (coordinator/engine/speculation_depth.h): the proposals
  // its next step may carry, from its recent acceptance and a proposal's measured cost; 0 =
  // backed off, with a single proposal every kSpeculationProbeEvery steps to notice when
  // guessing pays again.
  static constexpr int kSpeculationProbeEvery = 8;
  int next_speculation_depth(Entry& e);
  // What one more proposal's verification row costs, relative to a decoding sequence's share
  // of the step: at B sequences decoding and N rows so far, r(N)·B / T(B) with T and r (its
  // slope) from config_.row_costs. A sequence's tokens per unit time with k proposals are then
  // E(k) / (T/B + k·r) = (B/T)·E(k) / (1 + k·r·B/T): near free while the step is bound by
  // reading the weights (r << T/B), and about 1 once every row costs its full share, when
  // only proposals accepted nearly always pay.
  double verify_cost_per_proposal() const;
  // Applies a step's tokens to a sequence that fed proposals: the accepted ones are now in the
  // KV cache, the last is the next to feed; stops at a token that ends the sequence. True when
  // the last token's grammar step is left to finish_sampled_token (a constrained sequence).
  bool apply_speculative_tokens(Entry& e, const SeqStep& s, std::span<const SampledToken> tokens,
                                SequenceEvent& event);
  // A sampled token just appended (the last of `event`): its grammar's step, then the
  // sequence's end or, when its grammar goes on, its next mask (queued in masks_pending to be
  // computed with the step's others, or handed to the warmer). `event` goes to `events`.
  // An embedding sequence's share of a step (null: its pooling took no row of it).
  static void take_pooled_share(Entry& e, const PooledHidden* share);
  // Its pooled vector once the prompt is done: the mean of the rows taken; empty if none came.
  static std::vector<float> pooled_embedding(const Entry& e);
  void finish_sampled_token(Entry& e, SequenceEvent event, std::vector<SequenceEvent>& events,
                            std::vector<PendingMask>& masks_pending);
  // Cuts a constrained sequence's proposals where its grammar stops them and keeps, in e, the
  // grammar's step by each and the mask of each row after them (scheduler_masks.cc).
  void fit_proposals_to_grammar(Entry& e, std::vector<int32_t>* draft);
  // The executors are to drop the sequence's state (the next plan lists it in `dropped`).
  void forget_on_executors(Entry& e);
  void remove_running(const Entry& e);
  // The pending fork of `parent`, made while the plan's step computing the rest of its
  // prompt is added: choices 1..n-1 share its blocks and join the plan sampling from that
  // step, or queue (owning nothing) when max_num_seqs is reached.
  void fork(Entry& parent, StepPlan& plan);
  // The request's sampling for the choice `seq` is, seeded from the sequence id when unseeded.
  static SamplingParams choice_sampling(const Request& request, SeqId seq);
  void finish(Entry& e, FinishReason reason);  // frees blocks; the entry is erased by the caller
  // finish, the event marked finished with `reason`, and the entry erased.
  void end_sequence(Entry& e, SequenceEvent& event, FinishReason reason);

  SchedulerConfig config_;
  std::unique_ptr<Proposer> proposer_;  // null: no speculation
  int max_len_;
  BlockManager blocks_;
  std::unordered_map<SeqId, std::unique_ptr<Entry>> entries_;
  std::vector<Entry*> running_;           // kept sorted by (priority, arrival)
  std::set<Entry*, RunsBefore> waiting_;  // ditto
  uint64_t next_arrival_ = 0;
  uint64_t next_step_id_ = 0;
  uint64_t num_preemptions_ = 0;
  uint64_t prefix_query_tokens_ = 0;
  int static_members_left_ = 0;
  std::vector<SeqId> dropped_;  // for the next plan's `dropped`
  StepCostModel cost_model_;
  double step_gap_ = 0;  // step_gap_seconds()
  // What the last plan carried, for on_step_time.
  struct PlanLoad {
    uint64_t step_id = 0;
    int decodes = 0;
    int prefill_tokens = 0;
    std::vector<SeqId> decode_ids;  // whose decode_steps/decode_seconds the time goes to
    bool timed = true;  // no plan yet, or its time was taken
  };
  PlanLoad last_plan_;
  std::vector<Entry*> step_decodes_;  // the decodes of the plan schedule() is building
  // The plan being built: the sequences it may decode and the proposal rows added so far
  // (verify_cost_per_proposal).
  int step_decoding_ = 0;
  int step_proposal_rows_ = 0;
  int prefill_token_cap_ = 0;
  int prompt_rows_left_ = 0;  // the plan's prompt-logprob rows still free (chunk_within_prompt_rows)
  uint64_t prefill_capped_steps_ = 0;
  uint64_t tpot_capped_steps_ = 0;
  uint64_t deferred_masks_total_ = 0;
  SpecDecodeStats spec_stats_;
  // A draft forward's time over the target step's, averaged over the steps that measured it
  // (StepResult::draft_seconds); -1 until one did.
  double draft_cost_ = -1.0;
  // Computes the step's structured-output masks in parallel (on_step_result).
  structured::MaskPool mask_pool_;
  std::vector<SeqId> deferred_masks_;  // sequences whose Entry::mask_deferred is set
  structured::MaskWarmer mask_warmer_;  // computes deferred masks off the engine thread
  double recent_step_seconds_ = 0;      // executor time of the recent steps (moving average)
  // The end of the time a step's masks may take: the smaller of structured_mask_budget_ms and
  // the recent step time, so a step with masks takes at most about twice one without.
  std::chrono::steady_clock::time_point mask_deadline() const;
  // Hands `e`'s next mask to the warmer (or, defer_step, the step of its grammar by its last
  // token and then the mask); `e` sits out steps until advance_deferred_masks takes it up.
  void defer_mask(Entry& e);
  void defer_step(Entry& e);
  double mask_budget_seconds() const;
  // How much of a `chunk` of `e`'s prompt (`remaining` tokens left) may run: all of it, or,
  // while its mask is deferred, none of the last token, which samples.
  int chunk_before_mask(const Entry& e, int remaining, int chunk) const;
  // How much of a `chunk` of `e`'s prompt from position `from` fits the step's prompt-logprob
  // rows left (kPromptLogprobRowsPerStep; one a token before the prompt's last, for a request
  // asking prompt logprobs): all of it, fewer tokens, or 0 (it waits for the next step).
  // Continuous batching with chunked prefill only: otherwise a prompt is not split.
  int chunk_within_prompt_rows(const Entry& e, int from, int chunk) const;
  // Takes the rows a chunk so cut computes from the step's.
  void take_prompt_rows(const Entry& e, int from, int chunk);
  // Computes the masks of `entries` within one budget; true for each one that is done.
  std::vector<char> prepare_masks(const std::vector<Entry*>& entries);
  // After its mask: ends `e` (event filled, entry erased) when no token can continue its
  // grammar or it is at its length limit.
  void end_if_mask_or_length_stops(Entry& e, SequenceEvent& event);
  // LoRA adapters (scheduler_lora.cc). Under max_loras, admission tracks the adapters the
  // running sequences name and whether one waiting was passed over in this pass.
  struct LoraAdmission {
    std::set<std::string> running;  // "" (the base) among them is not counted
    bool passed_over = false;
  };
  LoraAdmission lora_admission() const;
  // Whether a sequence of `lora` may be admitted beside the running ones; false marks the
  // pass so the adapter sequences behind it wait too (the running adapters drain rather
  // than starve it), while the base's go on.
  bool admits_lora(LoraAdmission& admission, const std::string& lora) const;
  // Moves the queued loads, and the unloads no sequence waits for any more, into `plan`.
  void take_lora_changes(StepPlan& plan);
  // Queues the run-time loads again (the executors lost them).
  void resend_runtime_loras();
  std::vector<std::pair<std::string, std::string>> lora_loads_;  // for the next plan
  std::vector<std::string> lora_unloads_;                         // once no sequence names them
  std::map<std::string, std::string> runtime_loras_;              // loaded at run time, still served
};

}  // namespace tessera
