#pragma once
// A stand-in for the model in scheduler tests. It keeps a shadow KV cache (one token id per
// slot) and checks, every step, that each sequence's block table really holds its own
// tokens at every position the step reads: prefix sharing, copy-on-write, preemption and
// eviction bugs all show up as a wrong token in a slot. Sampled tokens are a fixed function
// of (sequence, token index), so a preempted and recomputed sequence must produce exactly
// the tokens it would have produced without preemption. With a sliding window W it reads
// only what the real attention reads (from the first new token's window on) and checks that
// every block wholly before that has been given back (-1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/step_plan.h"
#include "coordinator/scheduler.h"

namespace tessera::testing {

class FakeExecutor {
 public:
  FakeExecutor(int block_size, int num_blocks, int vocab = 50, int window = 0)
      : block_size_(block_size),
        vocab_(vocab),
        window_(window),
        kv_(static_cast<size_t>(block_size) * num_blocks, -1) {}

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

  // Runs one plan against the shadow cache; records every sampled token.
  StepResult execute(const StepPlan& plan) {
    StepResult result;
    result.step_id = plan.step_id;
    for (const auto& [src, dst] : plan.block_copies)
      std::copy_n(kv_.begin() + slot(src, 0), block_size_, kv_.begin() + slot(dst, 0));
    for (const SeqStep& s : plan.seqs) {
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
};

}  // namespace tessera::testing
