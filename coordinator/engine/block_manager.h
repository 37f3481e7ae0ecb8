#pragma once
// The paged KV cache's bookkeeping (block ids only; the KV itself lives on the workers).
//
// Every block is in exactly one place:
//   - free:      no owner, no content worth keeping (a stack, reused first);
//   - cached:    no owner, but it holds a full block of a prefix that may be asked for again
//                (an LRU list; evicted oldest-first when the free stack is empty);
//   - owned:     ref_count > 0 sequences list it in their block table.
// Free and cached blocks both count as free: num_free_blocks() is exactly how many blocks
// an allocation can still take.
//
// Prefix sharing: when a sequence has computed a FULL block, commit() files it under a
// chained content hash (see prefix_hash.h). A later sequence whose tokens start with the same
// full blocks shares them (ref_count + 1) instead of recomputing them. A sequence that must
// write into a block it shares gets a private copy first (copy-on-write): the (src, dst) pair
// is reported so the executor copies the KV before the step.
//
// Sliding window: when no step of a sequence will read its oldest tokens again (a model whose
// every layer attends only to the last W keys), release_blocks_before() gives back the
// leading blocks that hold only such tokens. Their table entries become -1, so block i still
// holds tokens [i*bs, (i+1)*bs); each is released exactly as free() would release it.
//
// The interface is plan/commit: *_cost() and find_cached_prefix() only look; admit(),
// append_slots(), commit(), release_blocks_before() and free() change state and check they
// were affordable.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/step_plan.h"
#include "coordinator/engine/prefix_hash.h"

namespace tessera {

// Leading full blocks of a token sequence that the prefix cache holds.
struct PrefixHit {
  std::vector<int32_t> blocks;  // in order; block i holds tokens [i*bs, (i+1)*bs)
  int num_evictable = 0;        // how many of them are currently cached-unowned (count as free)
  uint64_t root = kRootPrefixHash;  // the chain's start (prefix_root of the sequence's adapter)
  uint64_t last_hash = kRootPrefixHash;  // chain hash of the last hit block (root when none)
  int num_tokens(int block_size) const { return static_cast<int>(blocks.size()) * block_size; }
};

struct BlockManagerStats {
  int num_blocks = 0;
  int num_free = 0;       // free + cached (everything an allocation may take)
  int num_cached = 0;     // of num_free: unowned blocks kept for prefix reuse
  int num_sequences = 0;  // sequences holding a block table
  uint64_t prefix_hit_blocks = 0;  // blocks shared instead of recomputed, since start
  uint64_t prefix_hit_tokens = 0;  // tokens whose KV was reused, since start
  uint64_t cow_copies = 0;         // copy-on-write block copies issued
  uint64_t blocks_allocated = 0;   // blocks taken from the pool (new ones and copies), since start
  uint64_t evictions = 0;          // cached blocks reclaimed for new content
  uint64_t window_releases = 0;    // blocks given back because a sliding window moved past them
};

class BlockManager {
 public:
  BlockManager(int block_size, int num_blocks, bool prefix_caching = true);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()) + num_cached_; }
  int blocks_needed(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  bool has_sequence(SeqId id) const { return seqs_.count(id) != 0; }

  // --- plan (no state change) ---
  // The longest run of leading full blocks of `tokens` held by the cache, each verified
  // token by token (a hash match alone is not trusted). Empty when prefix caching is off.
  // `root`: prefix_root of the sequence's LoRA adapter (the base model's by default).
  PrefixHit find_cached_prefix(std::span<const int32_t> tokens, uint64_t root = kRootPrefixHash) const;
  // Blocks that admit(hit), release_blocks_before(first_token) and append_slots(write_from,
  // end) would take from the free pool: evictable hit blocks (but not those wholly before
  // first_token: they go straight back), a copy for a shared block written into, new blocks.
  int admission_cost(const PrefixHit& hit, int write_from, int end, int first_token = 0) const;
  // Blocks append_slots(id, write_from, end) would take from the free pool.
  int append_cost(SeqId id, int write_from, int end) const;
  // The largest n such that append_slots(id, write_from, write_from + n) fits right now.
  int max_appendable_tokens(SeqId id, int write_from) const;

  // --- commit ---
  // Registers a new sequence whose block table starts with the hit blocks (shared).
  // `num_reused_tokens` (<= hit tokens) is what the caller actually skips computing.
  void admit(SeqId id, const PrefixHit& hit, int num_reused_tokens);
  // Makes the block table cover token slots [0, end), writing slots [write_from, end):
  // every written block that is shared is replaced by a private copy (pairs appended to
  // `copies`), then new blocks are appended. Returns false, changing nothing, when the free
  // pool cannot pay append_cost().
  bool append_slots(SeqId id, int write_from, int end, std::vector<std::pair<int32_t, int32_t>>* copies);
  // The sequence's first `num_computed` tokens are now in the KV cache: files every newly
  // completed full block in the prefix cache. `tokens` are the sequence's known tokens.
  void commit(SeqId id, std::span<const int32_t> tokens, int num_computed);
  // The child shares every block of the parent (for parallel sampling); a later write into
  // a shared block copies it.
  void fork(SeqId parent, SeqId child);
  // Drops the sequence's blocks: owned-by-nobody blocks become free, or cached when they hold
  // a filed prefix block (tail blocks first in the eviction order).
  void free(SeqId id);
  // Gives back the blocks past those `num_tokens` tokens need (the slots of rejected
  // speculative proposals); they were never filed, so they go straight to the free stack.
  void truncate(SeqId id, int num_tokens);
  // Gives back the blocks that hold only tokens before `first_token` (no later step reads
  // them: a sliding window has moved past); their table entries become -1. A block shared
  // with another sequence just loses this reference; a filed one stays cached for prefix
  // hits. Only blocks whose tokens are all computed may go. Returns how many were given back.
  int release_blocks_before(SeqId id, int first_token);

  // Entries are -1 for the leading blocks given back by release_blocks_before().
  const std::vector<int32_t>& block_table(SeqId id) const;
  // Blocks the sequence holds: its table minus the released leading entries.
  int num_held_blocks(SeqId id) const;
  int ref_count(int32_t block) const { return blocks_[block].ref_count; }
  BlockManagerStats stats() const;
  // Aborts (TESSERA_CHECK) unless: every block is in exactly one of free / cached / owned,
  // each ref count equals the number of block tables listing the block, no table lists a
  // block twice, -1 entries are exactly the released leading ones, the free count is exact,
  // and the hash index matches the cached contents.
  void check_invariants() const;

  // The KV contents behind every block are gone (the workers were restarted): forget every
  // cached prefix so nothing is reused. Only valid while no sequence owns blocks.
  void forget_cached_contents();

 private:
  struct Block {
    int32_t ref_count = 0;
    bool filed = false;      // in the hash index (holds a verified full prefix block)
    bool in_lru = false;     // cached and unowned
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    int32_t lru_prev = -1;
    int32_t lru_next = -1;
  };
  struct SeqBlocks {
    std::vector<int32_t> table;
    int num_filed = 0;       // leading blocks whose chain hash is known (filed or shared hits)
    uint64_t last_hash = 0;  // chain hash of block num_filed - 1
    int num_released = 0;    // leading entries given back (-1) by release_blocks_before()
  };

  SeqBlocks& seq(SeqId id);
  const SeqBlocks& seq(SeqId id) const;
  int32_t take_block();  // from the free stack, else evicts the LRU cached block
  void release(int32_t block);
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  std::span<const int32_t> block_tokens(int32_t block) const;

  int block_size_;
  int num_blocks_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> tokens_;      // block_size tokens per block, valid while filed
  std::vector<int32_t> free_;        // stack of free, unfiled blocks
  int32_t lru_head_ = -1;            // oldest cached block: evicted first
  int32_t lru_tail_ = -1;
  int num_cached_ = 0;
  std::unordered_map<uint64_t, int32_t> index_;  // chain hash -> filed block
  std::unordered_map<SeqId, SeqBlocks> seqs_;
  uint64_t prefix_hit_blocks_ = 0;
  uint64_t prefix_hit_tokens_ = 0;
  uint64_t cow_copies_ = 0;
  uint64_t blocks_allocated_ = 0;
  uint64_t evictions_ = 0;
  uint64_t window_releases_ = 0;
};

}  // namespace tessera
