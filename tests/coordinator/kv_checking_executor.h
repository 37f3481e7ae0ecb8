#pragma once
// The checking executor, a stand-in for the model in scheduler tests. It keeps a shadow KV
// cache (one token id per slot) and checks, every step, that each sequence's block table
// really holds its own tokens at every position the step reads: prefix sharing,
// copy-on-write, preemption and eviction bugs all show up as a wrong token in a slot. Sampled
// tokens are a fixed function of (sequence, token index), so a preempted and recomputed
// sequence must produce exactly the tokens it would have produced without preemption. With a
// sliding window W it reads only what the real attention reads (from the first new token's
// window on) and checks that every block wholly before that has been given back (-1). Plans
// are step deltas: it applies them through the same SequenceStates as the worker, so a delta
// the scheduler gets wrong shows up as a refused plan or a wrong slot, and it hands the tests
// each step in full (ResolvedPlan: what the executor sees once the deltas are applied).
//
// Why it is not the scripted executor (tests/scripted_executor.h), the stand-in model of the
// engine and server tests: this one verifies the scheduler's block tables, so it is driven
// by a Scheduler step by step (the tests call execute() and feed the events back with
// apply()), must know every sequence's tokens (add()) to check every slot, and reports a
// wrong slot where it is read. The scripted executor only samples, counts and fails as told,
// behind an Engine or EngineService.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/sequence_states.h"
#include "common/step_plan.h"
#include "coordinator/engine/scheduler.h"

namespace tessera::testing {

// One sequence's step with the executor's state applied.
struct ResolvedStep {
  SeqId seq_id = 0;
  uint32_t version = 0;
  std::vector<int32_t> tokens;
  int32_t num_computed = 0;
  bool sample = false;
  SeqId sample_from = 0;              // a forked choice's first step: its parent's row
  std::vector<int32_t> block_table;   // the whole table (-1 for released entries)
  SamplingParams sampling;
  int32_t num_generated = 0;          // the index of the token this step samples
  std::vector<int32_t> penalty_tokens;  // prompt + output so far, only with a penalty
  int32_t penalty_prompt_len = 0;
};

struct ResolvedPlan {
  uint64_t step_id = 0;
  std::vector<SeqId> dropped;
  std::vector<ResolvedStep> seqs;
  std::vector<std::pair<int32_t, int32_t>> block_copies;
};

class KvCheckingExecutor {
 public:
  KvCheckingExecutor(int block_size, int num_blocks, int vocab = 50, int window = 0)
      : block_size_(block_size),
        vocab_(vocab),
        window_(window),
        kv_(static_cast<size_t>(block_size) * num_blocks, -1),
        states_(block_size, num_blocks) {}

  // The token a sequence draws as its `index`-th output.
  int32_t token_for(SeqId id, int32_t index) const {
    uint64_t x = (id + 1) * 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(index) * 0xbf58476d1ce4e5b9ULL);
    x ^= x >> 29;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 32;
    return static_cast<int32_t>(x % static_cast<uint64_t>(vocab_));
  }

  // Tells the executor a sequence's prompt (what the API layer would know).
  void add(SeqId id, std::vector<int32_t> prompt) { known_[id] = std::move(prompt); }
  void forget(SeqId id) { known_.erase(id); }
  const std::vector<int32_t>& tokens(SeqId id) { return known_.at(id); }

  // Applies the plan's deltas (a refused plan is a test failure) and returns it in full.
  ResolvedPlan resolve(const StepPlan& plan) {
    ResolvedPlan out;
    out.step_id = plan.step_id;
    out.dropped = plan.dropped;
    out.block_copies = plan.block_copies;
    StatusOr<std::vector<SeqView>> views = states_.apply(plan);
    if (!views.is_ok()) {
      ADD_FAILURE() << "the executor refused the plan: " << views.status().to_string();
      return out;
    }
    for (const SeqView& v : views.value()) {
      ResolvedStep& r = out.seqs.emplace_back();
      r.seq_id = v.step->seq_id;
      r.version = v.step->version;
      r.tokens = v.step->tokens;
      r.num_computed = v.step->num_computed;
      r.sample = v.step->sample;
      r.sample_from = v.sample_from();
      r.block_table = v.state->block_table;
      r.sampling = v.state->sampling;
      r.num_generated = v.num_generated();
      r.penalty_tokens = v.penalty_tokens();
      r.penalty_prompt_len = v.state->sampling.has_penalty() ? v.state->prompt_len : 0;
    }
    return out;
  }

  // Runs one plan against the shadow cache; records every sampled token. The plan as the
  // executor saw it is last_plan().
  StepResult execute(const StepPlan& delta) {
    last_ = resolve(delta);
    const ResolvedPlan& plan = last_;
    StepResult result;
    result.step_id = plan.step_id;
    for (const auto& [src, dst] : plan.block_copies)
      std::copy_n(kv_.begin() + slot(src, 0), block_size_, kv_.begin() + slot(dst, 0));
    for (const ResolvedStep& s : plan.seqs) {
      const std::vector<int32_t>& known = known_.at(s.seq_id);
      const int end = s.num_computed + static_cast<int>(s.tokens.size());
      EXPECT_LE(static_cast<size_t>(end), known.size()) << "seq " << s.seq_id;
      EXPECT_GE(static_cast<int>(s.block_table.size()) * block_size_, end) << "seq " << s.seq_id;
      const int first = window_ > 0 ? std::max(0, s.num_computed - window_ + 1) : 0;
      for (int k = 0; k < first / block_size_; ++k)
        EXPECT_EQ(s.block_table[k], -1) << "step " << plan.step_id << " seq " << s.seq_id << " still holds block "
                                        << k << ", which its window has left";
      for (int p = first; p < s.num_computed; ++p) {
        const int32_t block = s.block_table[p / block_size_];
        const int32_t got = block < 0 ? -1 : kv_[slot(block, p % block_size_)];  // -1: a freed block
        if (got != known[p]) {
          ADD_FAILURE() << "step " << plan.step_id << " seq " << s.seq_id << " reads token " << got
                        << " at position " << p << ", expected " << known[p];
          break;
        }
      }
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        const int p = s.num_computed + static_cast<int>(i);
        EXPECT_EQ(s.tokens[i], known[p]) << "seq " << s.seq_id << " fed a wrong token at " << p;
        const int32_t block = s.block_table[p / block_size_];
        if (block < 0) {
          ADD_FAILURE() << "step " << plan.step_id << " seq " << s.seq_id << " writes position " << p
                        << " into a freed block";
          continue;
        }
        kv_[slot(block, p % block_size_)] = s.tokens[i];
      }
      EXPECT_EQ(s.sample, end == static_cast<int>(known.size())) << "seq " << s.seq_id;
      if (s.sample) {
        SampledToken t;
        t.seq_id = s.seq_id;
        t.token = token_for(s.seq_id, s.num_generated);
        result.tokens.push_back(t);
      }
    }
    return result;
  }

  const ResolvedPlan& last_plan() const { return last_; }
  // The sequences whose state the executor holds.
  const SequenceStates& states() const { return states_; }

  // Feeds the scheduler's events back into what the executor knows.
  void apply(const std::vector<SequenceEvent>& events) {
    for (const SequenceEvent& e : events) {
      auto it = known_.find(e.seq_id);
      if (it == known_.end()) continue;
      for (const SampledToken& t : e.new_tokens) it->second.push_back(t.token);
    }
  }

 private:
  size_t slot(int32_t block, int offset) const { return static_cast<size_t>(block) * block_size_ + offset; }

  int block_size_;
  int vocab_;
  int window_;
  std::vector<int32_t> kv_;
  std::unordered_map<SeqId, std::vector<int32_t>> known_;
  SequenceStates states_;
  ResolvedPlan last_;
};

}  // namespace tessera::testing
