#pragma once
// The incremental matcher of a compiled grammar over one vocabulary. A match state is a set
// of parse stacks (a pushdown automaton run nondeterministically over bytes): each stack is a
// state of some rule NFA that reads a byte next, above the return states of the rules that
// called it. Stacks are hash-consed nodes (state, parent), so a state is a short sorted list
// of node ids, states that are equal compare equal, and nothing is copied per step.
//
// The allowed-token mask of a state is computed by walking the vocabulary trie, with two
// caches that make the per-step cost small after the first steps (docs/structured-output.md,
// "Cost"):
//   - per rule-NFA state q (context-free, shared by every stack whose top is q, in any
//     request using this grammar): the tokens accepted without leaving q's rule, plus the
//     trie nodes where the rule completes mid-token ("pop points");
//   - per match state: the finished mask. Only the pop points need the stack below the top,
//     and only for the tokens that continue past them (a few subtrees of the trie).
// One TokenConstraint is shared by every sequence constrained by the same grammar (the
// caches are its mutable part, behind a mutex); its memory is bounded (caches are dropped
// when over budget; a grammar whose stacks outgrow kMaxStackNodes fails the sequence).
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "coordinator/structured/grammar.h"
#include "coordinator/structured/token_vocabulary.h"

namespace tessera::structured {

// A point in the output: the set of live stacks (sorted node ids). Empty = dead (the bytes
// so far cannot continue to any string of the grammar).
struct MatchState {
  std::vector<uint32_t> stacks;
  bool operator==(const MatchState&) const = default;
};

class TokenConstraint {
 public:
  TokenConstraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary);

  MatchState initial() const;
  // The state after `bytes`; dead when they leave the grammar.
  MatchState advance_bytes(const MatchState& state, std::string_view bytes) const;
  MatchState advance_token(const MatchState& state, int32_t token) const;
  // The grammar may end here (an end-of-sequence token is allowed).
  bool can_end(const MatchState& state) const;
  // The grammar has ended: nothing but the end may follow.
  bool must_end(const MatchState& state) const;
  bool is_dead(const MatchState& state) const { return state.stacks.empty(); }
  // Whether `text` is a complete string of the grammar (tests, fuzzers).
  bool matches(std::string_view text) const { return can_end(advance_bytes(initial(), text)); }

  // The tokens allowed next, as a bitset over the vocabulary (bit i of word i / 32 = token i;
  // vocabulary().mask_words() words). End-of-sequence tokens are the caller's (can_end).
  void fill_mask(const MatchState& state, std::vector<uint32_t>* mask) const;

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // The stack space ran out (kMaxStackNodes): states from then on may be dead.
  bool exhausted() const;

  static constexpr size_t kMaxStackNodes = 1u << 20;
  static constexpr size_t kMaxCacheBytes = size_t{256} << 20;

 private:
  static constexpr uint32_t kEnd = 0;          // below the root rule
  static constexpr uint32_t kAccept = 1;       // the root rule completed
  static constexpr uint32_t kFrameBottom = 2;  // below the rule of a per-state cache walk
  static constexpr uint32_t kPopped = 3;       // that rule completed
  static constexpr uint32_t kFirstNode = 4;

  struct StackNode {
    int32_t state;
    uint32_t parent;
  };
  struct FrameMask {
    std::vector<uint32_t> bits;
    std::vector<uint32_t> pop_points;  // trie nodes
  };
  struct VectorHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };

  uint32_t intern(int32_t state, uint32_t parent) const;
  // Appends the stack tops reachable from (state, parent) without reading a byte.
  void closure(int32_t state, uint32_t parent, std::vector<uint32_t>& out) const;
  // The stacks after node `n` reads byte `b` (memoized), as a range of memo_pool_.
  std::pair<uint32_t, uint32_t> step(uint32_t n, uint8_t b) const;
  void advance_set(const std::vector<uint32_t>& from, uint8_t b, std::vector<uint32_t>& out) const;
  // Marks the tokens below trie node `t` that `stacks` can read; records pop points.
  void walk(uint32_t t, const std::vector<uint32_t>& stacks, std::vector<uint32_t>& bits,
            std::vector<uint32_t>* pop_points, size_t depth) const;
  const FrameMask& frame_mask(int32_t state) const;
  void mark_tokens(uint32_t t, std::vector<uint32_t>& bits) const;
  void trim_caches() const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  mutable std::mutex mu_;
  mutable std::vector<StackNode> nodes_;
  mutable std::unordered_map<uint64_t, uint32_t> node_ids_;
  mutable std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> step_memo_;
  mutable std::vector<uint32_t> memo_pool_;
  mutable std::unordered_map<int32_t, FrameMask> frame_cache_;
  mutable std::unordered_map<std::vector<uint32_t>, std::vector<uint32_t>, VectorHash> mask_cache_;
  mutable std::unordered_map<uint32_t, std::vector<uint32_t>> pop_cache_;  // parent node -> stacks
  mutable size_t cache_bytes_ = 0;
  mutable bool exhausted_ = false;
  mutable std::vector<std::vector<uint32_t>> scratch_;  // per trie depth
};

}  // namespace tessera::structured
