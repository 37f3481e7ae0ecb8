#pragma once
// The incremental matcher of a compiled grammar over one vocabulary. A match state is a set
// of parse stacks (a pushdown automaton run nondeterministically over bytes): each stack is a
// state of some rule NFA that reads a byte next, above the return states of the rules that
// called it. Stacks are hash-consed nodes (state, parent), so a state is a short sorted list
// of node ids, states that are equal compare equal, and nothing is copied per step.
//
// The allowed-token mask of a state is computed by walking the vocabulary trie, with caches
// that make the per-step cost small after the first steps (docs/structured-output.md,
// "Cost"):
//   - per rule-NFA state q (context-free, shared by every stack whose top is q, in any
//     request using this grammar): the tokens accepted without leaving q's rule, plus the
//     children of the trie nodes where the rule completes mid-token ("pop points");
//   - per stack node: the tokens that pop its top rule mid-token and go on below it. Only
//     these need the stack below the top, and only for the tokens that continue past the
//     pop points (a few subtrees of the trie);
//   - per match state: the finished mask (the sets above OR'ed together).
// A walk skips a trie child whose byte no stack reads without a memo lookup, and allows a
// whole subtree at once when its bytes all bring the one live stack back to itself (plain
// characters inside a JSON string), so even a cold mask rarely walks much of the trie.
// One TokenConstraint is shared by every sequence constrained by the same grammar, and a
// step's masks are computed on several threads at once (mask_pool.h), so its caches are
// behind two locks: a finished mask is read under a shared lock (many sequences at once, never
// waiting for another's trie walk), while everything that grows the automaton — stack nodes,
// byte-step memo, the per-state caches, and the walks that fill them — is under one mutex
// (a cold walk of one grammar waits for another of the same grammar, and then usually finds
// its mask already filled). Memory is bounded (caches are dropped when over budget; a
// grammar whose stacks outgrow kMaxStackNodes fails the sequence).
#include <chrono>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "coordinator/engine/structured/grammar.h"
#include "coordinator/engine/structured/token_vocabulary.h"
#include "coordinator/engine/structured/u64_map.h"

namespace tessera::structured {

// A point in the output: the set of live stacks (sorted node ids). Empty = dead (the bytes
// so far cannot continue to any string of the grammar).
struct MatchState {
  std::vector<uint32_t> stacks;
  bool operator==(const MatchState&) const = default;
};

// A set of token ids as whichever is smaller: the ids (most grammar states allow a few hundred
// tokens) or the vocabulary bitset (inside a JSON string almost all are allowed). The caches
// hold these, not bitsets: a 128k vocabulary's bitset is 16 kB, and a cold mask used to pay
// for fresh pages of every bitset it cached (page faults were a fifth of a miss's time).
struct TokenIdSet {
  bool dense = false;
  std::vector<uint32_t> data;  // dense: the bitset; else the ids, ascending

  // The set of `bits`, which are left all zero (they are the walks' reusable scratch).
  static TokenIdSet take(std::vector<uint32_t>& bits);
  void or_into(std::vector<uint32_t>& bits) const;
  void write_to(size_t words, std::vector<uint32_t>* bits) const;
  size_t bytes() const { return 4 * data.size() + sizeof(TokenIdSet); }
};

class TokenConstraint {
 public:
  TokenConstraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary);

  MatchState initial() const;
  // The state after `bytes`; dead when they leave the grammar.
  MatchState advance_bytes(const MatchState& state, std::string_view bytes) const;
  MatchState advance_token(const MatchState& state, int32_t token) const;
  // advance_token, unless another thread's walk of this grammar holds it past `deadline`
  // (nullopt then; the advance itself, once begun, runs to its end).
  std::optional<MatchState> advance_token_until(const MatchState& state, int32_t token,
                                                std::chrono::steady_clock::time_point deadline) const;
  // The grammar may end here (an end-of-sequence token is allowed).
  bool can_end(const MatchState& state) const;
  // The grammar has ended: nothing but the end may follow.
  bool must_end(const MatchState& state) const;
  bool is_dead(const MatchState& state) const { return state.stacks.empty(); }
  // Whether `text` is a complete string of the grammar (tests, fuzzers).
  bool matches(std::string_view text) const { return can_end(advance_bytes(initial(), text)); }

  // The tokens allowed next, as a bitset over the vocabulary (bit i of word i / 32 = token i;
  // vocabulary().mask_words() words). End-of-sequence tokens are the caller's (can_end).
  // Safe to call from several threads at once (as every public member is).
  void fill_mask(const MatchState& state, std::vector<uint32_t>* mask) const {
    (void)fill_mask_until(state, mask, std::chrono::steady_clock::time_point::max());
  }
  // fill_mask, but it gives up (false, *mask unchanged) once `deadline` has passed: while it
  // waits for another thread's walk of this grammar, or between two stacks' walks of its own
  // (what those cached stays, so calling it again goes on from there).
  bool fill_mask_until(const MatchState& state, std::vector<uint32_t>* mask,
                       std::chrono::steady_clock::time_point deadline) const;
  // The mask of `state` when it is cached (a finished walk); never waits for a walk.
  bool cached_mask(const MatchState& state, std::vector<uint32_t>* mask) const { return find_mask(state, mask); }

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  // The stack space ran out (kMaxStackNodes): states from then on may be dead.
  bool exhausted() const;
  // One walk or step of this grammar has taken longer than kCostlyWork: the engine then leaves
  // all of its work to the MaskWarmer rather than try it on the step path, since a single
  // walk cannot be cut short.
  bool costly() const { return costly_.load(std::memory_order_relaxed); }
  static constexpr std::chrono::milliseconds kCostlyWork{20};

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
    TokenIdSet tokens;  // accepted without leaving the rule
    bool pops = false;  // the rule completes inside some token (at "pop points" of the trie)
    std::vector<uint32_t> pop_children;  // the pop points' children, by byte
  };
  struct VectorHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };

  // advance_bytes with automaton_mu_ held by the caller.
  MatchState advance_bytes_locked(const MatchState& state, std::string_view bytes) const;
  uint32_t intern(int32_t state, uint32_t parent) const;
  // Appends the stack tops reachable from (state, parent) without reading a byte.
  void closure(int32_t state, uint32_t parent, std::vector<uint32_t>& out) const;
  // The stacks after node `n` reads byte `b` (memoized), as a range of memo_pool_.
  std::pair<uint32_t, uint32_t> step(uint32_t n, uint8_t b) const;
  void advance_set(const std::vector<uint32_t>& from, uint8_t b, std::vector<uint32_t>& out) const;
  // Marks the tokens below trie node `t` that `stacks` can read; records pop points.
  void walk(uint32_t t, const std::vector<uint32_t>& stacks, std::vector<uint32_t>& bits,
            std::vector<uint32_t>* pop_points, size_t depth) const;
  // Marks what trie node `c` allows, its stacks `stacks` after reading c's byte, and walks on.
  void visit(uint32_t c, const std::vector<uint32_t>& stacks, bool popped, std::vector<uint32_t>& bits,
             std::vector<uint32_t>* pop_points, size_t depth) const;
  // Whether node `n` reading any byte of `bytes` stays exactly the stack n (a self-loop such
  // as a JSON string's characters): then every token of a subtree reading only those bytes
  // is allowed, without walking it.
  bool loops_over(uint32_t n, const ByteSet& bytes) const;
  const FrameMask& frame_mask(int32_t state) const;
  // The tokens stack node n allows by completing its top rule inside the token and going on
  // in the rules below it.
  const TokenIdSet& pop_tokens(uint32_t n, const FrameMask& fm) const;
  void mark_tokens(uint32_t t, std::vector<uint32_t>& bits) const;
  void mark_subtree(uint32_t t, std::vector<uint32_t>& bits) const;
  // Copies the finished mask of `state` into *mask if there is one (shared lock only).
  bool find_mask(const MatchState& state, std::vector<uint32_t>* mask) const;
  void trim_caches() const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  // automaton_mu_ guards every mutable member below but mask_cache_, which is read under a
  // shared lock of masks_mu_ and written (and cleared) under both, automaton_mu_ first.
  mutable std::timed_mutex automaton_mu_;  // timed: fill_mask_until waits for it only so long
  mutable std::shared_mutex masks_mu_;
  std::vector<ByteSet> state_bytes_;  // per grammar state: the bytes its edges read
  mutable std::vector<StackNode> nodes_;
  mutable U64Map node_ids_;           // (state, parent) -> node
  mutable U64Map step_memo_;          // (node, byte) -> [begin, end) of memo_pool_
  mutable std::vector<uint32_t> memo_pool_;
  mutable U64Map loop_set_ids_;       // node -> index into loop_sets_
  mutable std::vector<ByteSet> loop_sets_;
  mutable std::unordered_map<int32_t, FrameMask> frame_cache_;
  mutable std::unordered_map<std::vector<uint32_t>, TokenIdSet, VectorHash> mask_cache_;
  mutable std::unordered_map<uint32_t, std::vector<uint32_t>> pop_cache_;  // parent node -> stacks
  mutable std::unordered_map<uint32_t, TokenIdSet> pop_tokens_;          // stack node -> tokens
  // Bitsets all zero between uses: what a walk marks, and a mask being put together.
  mutable std::vector<uint32_t> walk_scratch_, mask_scratch_;
  mutable std::vector<uint32_t> pop_next_;
  mutable size_t cache_bytes_ = 0;
  mutable std::atomic<bool> exhausted_{false};  // read without the automaton's lock
  mutable std::atomic<bool> costly_{false};
  // Marks the grammar costly when the work begun at `start` took longer than kCostlyWork.
  void note_work_time(std::chrono::steady_clock::time_point start) const {
    if (std::chrono::steady_clock::now() - start > kCostlyWork) costly_.store(true, std::memory_order_relaxed);
  }
  MatchState initial_;                           // set by the constructor, then read only
  mutable std::vector<std::vector<uint32_t>> scratch_;  // per trie depth
};

}  // namespace tessera::structured
