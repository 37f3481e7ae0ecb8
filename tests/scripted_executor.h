#pragma once
// The stand-in model for tests that run the Engine or EngineService (and the servers in front
// of them): a StepExecutor whose behaviour each test scripts.
//
//   - which token each sequence samples: a function of the sampled row (sequence, index of the
//     output token, the prompt's first token, the step and the sequence's state) — the stock
//     ones below give the same ids to every sequence, pseudo-random ids, or a fixed script then
//     EOS; a per-prompt script (`script`) overrides it for the sequences whose prompt starts
//     with a given token. Tokens depend on nothing but the row, so a preempted and recomputed
//     sequence draws the same tokens again;
//   - or no script at all: the plans go on to a real model (`ScriptedExecutor(model)`), and
//     this one only counts, watches, delays and fails;
//   - per-step delays, a gate that holds steps at their start, failures (every step, or the
//     steps of the sequences whose prompt starts with a given token);
//   - what it was fed (tokens), how many steps began and how many ended well, and a look at
//     every sequence's step once its delta is applied (`observe`).
//
// Every plan's deltas go through SequenceStates, the worker's own code: a plan it refuses is a
// broken scheduler invariant, reported through scripted_executor_violation (a test failure)
// and returned as the step's error.
//
// The scheduler tests that drive the Scheduler directly use the other test executor,
// tests/coordinator/kv_checking_executor.h: it keeps a shadow KV cache and checks every block
// table the scheduler hands out, which needs a scheduler step by step, not an engine.
//
// Thread-safe: tests script it while the engine thread runs it. Header-only, so the fuzzers
// (which link no GoogleTest) use it as the tests do.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/sequence_states.h"
#include "common/step_executor.h"

namespace tessera::testing {

// How a broken invariant (a refused plan; a sequence started past its first prompt token when
// a script or failure needs that token) is reported. Defined once per program: as a
// GoogleTest failure in tests/scripted_executor.cc (part of tessera_test_support), as a trap
// in each fuzzer that uses this executor.
void scripted_executor_violation(const std::string& what);

// One row to sample, as a token script sees it.
struct SampleRow {
  SeqId seq_id = 0;
  int32_t index = 0;               // which output token: 0 is the sequence's first
  int32_t first_prompt_token = -1;  // -1 when the sequence started past it (a prefix-cache hit)
  const SeqView* view = nullptr;   // the step (allowed_tokens) and the sequence's state (sampling)
};

using TokenScript = std::function<int32_t(const SampleRow&)>;
using LogprobScript = std::function<float(const SampleRow&)>;

// Token `index` of every sequence under by_index(): an ordinary id of the kjv-llama
// vocabulary, never special (ids 0..2 are <unk>, <s>, </s>).
inline int32_t ordinary_token(int32_t index) { return 100 + (index * 7 + 3) % 500; }

// Every sequence writes ordinary_token(0), ordinary_token(1), ...
inline TokenScript by_index() {
  return [](const SampleRow& r) { return ordinary_token(r.index); };
}

// Pseudo-random ids in [3, vocab) by (sequence, index): byte-fallback pieces included, never
// <unk>, <s> or </s>.
inline TokenScript hashed_tokens(int32_t vocab) {
  return [vocab](const SampleRow& r) {
    uint64_t x = (r.seq_id + 7) * 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(r.index) * 0xbf58476d1ce4e5b9ULL);
    x ^= x >> 31;
    return 3 + static_cast<int32_t>(x % static_cast<uint64_t>(vocab - 3));
  };
}

// Every sequence writes `tokens`, then `then` for ever (EOS: what a model that has said its
// piece does).
inline TokenScript script_then(std::vector<int32_t> tokens, int32_t then) {
  return [tokens = std::move(tokens), then](const SampleRow& r) {
    return static_cast<size_t>(r.index) < tokens.size() ? tokens[static_cast<size_t>(r.index)] : then;
  };
}

class ScriptedExecutor final : public StepExecutor {
 public:
  // Samples by `tokens`.
  explicit ScriptedExecutor(TokenScript tokens = by_index()) : tokens_(std::move(tokens)) {}
  // Passes every plan to `model` and returns its result (counting, watching, delaying and
  // failing as scripted); its KV cache epoch is this executor's.
  explicit ScriptedExecutor(StepExecutor& model) : model_(&model) {}

  ScriptedExecutor(const ScriptedExecutor&) = delete;
  ScriptedExecutor& operator=(const ScriptedExecutor&) = delete;

  // ---- what is sampled ----
  void set_tokens(TokenScript tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    tokens_ = std::move(tokens);
  }
  // A sequence whose prompt starts with `first_prompt_token` writes `tokens` (then the token
  // script's). Needs each such sequence's first step to feed its first prompt token: turn
  // prefix caching off.
  void script(int32_t first_prompt_token, std::vector<int32_t> tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    scripts_[first_prompt_token] = std::move(tokens);
  }
  // The logprob of a sampled token (and of each top_logprobs entry); -0.5 unless set.
  void set_logprob(LogprobScript logprob) {
    std::lock_guard<std::mutex> lk(mu_);
    logprob_ = std::move(logprob);
  }

  // ---- timing and failures ----
  void set_step_delay(std::chrono::microseconds delay) { delay_us_ = delay.count(); }
  // Steps wait at their start (after steps_entered() counts them) until resume_steps().
  void pause_steps() {
    std::lock_guard<std::mutex> lk(gate_mu_);
    paused_ = true;
  }
  void resume_steps() {
    {
      std::lock_guard<std::mutex> lk(gate_mu_);
      paused_ = false;
    }
    gate_cv_.notify_all();
  }
  // Every step fails (an Internal error with `message`, after its deltas are applied).
  void fail_every_step(std::string message = "scripted failure") {
    std::lock_guard<std::mutex> lk(mu_);
    fail_every_step_ = true;
    failure_ = std::move(message);
  }
  // A step that holds a sequence whose prompt starts with `first_prompt_token` fails (see
  // script() on prefix caching).
  void fail_on(int32_t first_prompt_token, std::string message = "scripted failure") {
    std::lock_guard<std::mutex> lk(mu_);
    fail_on_ = first_prompt_token;
    failure_ = std::move(message);
  }
  void stop_failing() {
    std::lock_guard<std::mutex> lk(mu_);
    fail_every_step_ = false;
    fail_on_ = -1;
  }

  // ---- what happened ----
  // Called with each sequence's step once the plan's deltas are applied (on the engine thread).
  void observe(std::function<void(const SeqView&)> observer) {
    std::lock_guard<std::mutex> lk(mu_);
    observer_ = std::move(observer);
  }
  int steps_entered() const { return steps_entered_; }  // execute() calls begun
  int steps() const { return steps_; }                  // steps that returned a result
  int64_t fed() const { return fed_; }                  // tokens the plans fed, in all

  StatusOr<StepResult> execute(const StepPlan& plan) override {
    steps_entered_.fetch_add(1);
    {
      std::unique_lock<std::mutex> lk(gate_mu_);
      gate_cv_.wait(lk, [this] { return !paused_; });
    }
    if (const int64_t us = delay_us_.load(); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
    std::lock_guard<std::mutex> lk(mu_);
    for (const SeqStep& s : plan.seqs) fed_ += static_cast<int64_t>(s.tokens.size());
    if (model_ != nullptr && model_->kv_cache_epoch() != epoch_) {  // the model lost its sequences
      epoch_ = model_->kv_cache_epoch();
      states_.clear();
    }
    StatusOr<std::vector<SeqView>> views = states_.apply(plan);
    if (!views.is_ok()) {
      scripted_executor_violation("the executor refused the plan: " + views.status().to_string());
      return views.status();
    }
    if (Status st = note_first_tokens(plan, views.value()); !st.is_ok()) return st;
    if (observer_)
      for (const SeqView& v : views.value()) observer_(v);
    if (Status st = scripted_failure(views.value()); !st.is_ok()) return st;
    StatusOr<StepResult> result = model_ != nullptr ? model_->execute(plan) : sample(plan, views.value());
    if (result.is_ok()) ++steps_;
    return result;
  }

  uint64_t kv_cache_epoch() const override { return model_ != nullptr ? model_->kv_cache_epoch() : 0; }

 private:
  // Keeps each sequence's first prompt token (a forked choice has its parent's); a sequence
  // that started past it is a violation when a script or failure asks for it.
  Status note_first_tokens(const StepPlan& plan, const std::vector<SeqView>& views) {
    for (SeqId id : plan.dropped) first_.erase(id);
    const bool needed = !scripts_.empty() || fail_on_ >= 0;
    for (const SeqView& v : views) {
      const SeqStep& s = *v.step;
      if (s.num_computed == 0 && !s.tokens.empty()) first_[s.seq_id] = s.tokens[0];
      if (v.sample_from() != 0 && first_.count(v.sample_from())) first_[s.seq_id] = first_.at(v.sample_from());
      if (needed && !first_.count(s.seq_id)) {
        scripted_executor_violation("sequence " + std::to_string(s.seq_id) +
                                    " started past its first prompt token, which a script needs");
        return internal_error("unknown sequence");
      }
    }
    return Status::ok();
  }

  int32_t first_token(SeqId id) const {
    auto it = first_.find(id);
    return it == first_.end() ? -1 : it->second;
  }

  Status scripted_failure(const std::vector<SeqView>& views) const {
    bool fail = fail_every_step_;
    for (const SeqView& v : views) fail = fail || (fail_on_ >= 0 && first_token(v.step->seq_id) == fail_on_);
    return fail ? internal_error(failure_) : Status::ok();
  }

  int32_t token(const SampleRow& row) const {
    if (auto it = scripts_.find(row.first_prompt_token);
        it != scripts_.end() && static_cast<size_t>(row.index) < it->second.size())
      return it->second[static_cast<size_t>(row.index)];
    return tokens_(row);
  }

  StepResult sample(const StepPlan& plan, const std::vector<SeqView>& views) const {
    StepResult r;
    r.step_id = plan.step_id;
    for (const SeqView& v : views) {
      if (!v.step->sample) continue;
      const SampleRow row{v.step->seq_id, v.num_generated(), first_token(v.step->seq_id), &v};
      SampledToken t;
      t.seq_id = row.seq_id;
      t.token = token(row);
      t.logprob = logprob_(row);
      // The alternatives are the tokens the script gives the next indices, the sampled one first.
      for (int k = 0; k < v.state->sampling.logprobs; ++k) {
        SampleRow alt = row;
        alt.index += k;
        t.top_logprobs.push_back({token(alt), logprob_(alt)});
      }
      r.tokens.push_back(std::move(t));
    }
    return r;
  }

  StepExecutor* model_ = nullptr;
  uint64_t epoch_ = 0;

  std::atomic<int64_t> delay_us_{0};
  std::atomic<int> steps_entered_{0};
  std::atomic<int> steps_{0};
  std::atomic<int64_t> fed_{0};

  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool paused_ = false;

  std::mutex mu_;  // everything below, and the steps themselves
  TokenScript tokens_;
  LogprobScript logprob_ = [](const SampleRow&) { return -0.5f; };
  std::unordered_map<int32_t, std::vector<int32_t>> scripts_;
  bool fail_every_step_ = false;
  int32_t fail_on_ = -1;
  std::string failure_ = "scripted failure";
  std::function<void(const SeqView&)> observer_;
  std::unordered_map<SeqId, int32_t> first_;
  SequenceStates states_{0, 0};
};

}  // namespace tessera::testing
