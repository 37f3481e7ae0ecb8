#include "coordinator/engine/block_manager.h"

#include <algorithm>

#include "common/check.h"
#include "coordinator/engine/prefix_hash.h"

namespace tessera {

BlockManager::BlockManager(int block_size, int num_blocks, bool prefix_caching)
    : block_size_(block_size),
      num_blocks_(num_blocks),
      prefix_caching_(prefix_caching),
      blocks_(static_cast<size_t>(num_blocks)),
      tokens_(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size)) {
  TESSERA_CHECK_GT(block_size, 0);
  TESSERA_CHECK_GT(num_blocks, 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  // Pushed in reverse so that block 0 is handed out first (easier to read in tests).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

BlockManager::SeqBlocks& BlockManager::seq(SeqId id) {
  auto it = seqs_.find(id);
  TESSERA_CHECK(it != seqs_.end()) << "sequence " << id << " has no block table";
  return it->second;
}

const BlockManager::SeqBlocks& BlockManager::seq(SeqId id) const {
  auto it = seqs_.find(id);
  TESSERA_CHECK(it != seqs_.end()) << "sequence " << id << " has no block table";
  return it->second;
}

std::span<const int32_t> BlockManager::block_tokens(int32_t block) const {
  return {tokens_.data() + static_cast<size_t>(block) * block_size_, static_cast<size_t>(block_size_)};
}

PrefixHit BlockManager::find_cached_prefix(std::span<const int32_t> tokens, uint64_t root) const {
  PrefixHit hit;
  hit.root = root;
  hit.last_hash = root;
  if (!prefix_caching_ || index_.empty()) return hit;
  const size_t full = tokens.size() / block_size_;
  for (size_t i = 0; i < full; ++i) {
    auto chunk = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = hash_block_tokens(hit.last_hash, chunk);
    auto it = index_.find(h);
    if (it == index_.end()) break;
    const Block& b = blocks_[it->second];
    // A hash match is only a candidate: same parent and same tokens make it a real hit.
    if (b.parent_hash != hit.last_hash) break;
    auto cached = block_tokens(it->second);
    if (!std::equal(chunk.begin(), chunk.end(), cached.begin())) break;
    hit.blocks.push_back(it->second);
    if (b.ref_count == 0) ++hit.num_evictable;
    hit.last_hash = h;
  }
  return hit;
}

int BlockManager::admission_cost(const PrefixHit& hit, int write_from, int end, int first_token) const {
  const int hits = static_cast<int>(hit.blocks.size());
  const int needed = blocks_needed(end);
  int cost = hit.num_evictable + std::max(0, needed - hits);
  // Evictable hits wholly before the window are taken and given straight back.
  for (int k = 0; k < std::min(hits, first_token / block_size_); ++k)
    if (blocks_[hit.blocks[k]].ref_count == 0) --cost;
  if (write_from < end) {
    // Once admitted a hit block is shared iff someone else owned it already.
    for (int k = write_from / block_size_; k < std::min(hits, needed); ++k)
      if (blocks_[hit.blocks[k]].ref_count >= 1) ++cost;
  }
  return cost;
}

int BlockManager::append_cost(SeqId id, int write_from, int end) const {
  const SeqBlocks& s = seq(id);
  const int have = static_cast<int>(s.table.size());
  const int needed = blocks_needed(end);
  int cost = std::max(0, needed - have);
  if (write_from < end) {
    TESSERA_CHECK_GE(write_from / block_size_, s.num_released) << "sequence " << id << " writes a released block";
    for (int k = write_from / block_size_; k < std::min(have, needed); ++k)
      if (blocks_[s.table[k]].ref_count > 1) ++cost;
  }
  return cost;
}

int BlockManager::max_appendable_tokens(SeqId id, int write_from) const {
  const SeqBlocks& s = seq(id);
  const int have = static_cast<int>(s.table.size());
  TESSERA_CHECK_GE(write_from / block_size_, s.num_released) << "sequence " << id << " writes a released block";
  int budget = num_free_blocks();
  for (int k = write_from / block_size_; k < have; ++k) {
    if (blocks_[s.table[k]].ref_count > 1) {
      if (budget == 0) return 0;  // cannot even copy the block it writes first
      --budget;
    }
  }
  return std::max(0, (have + budget) * block_size_ - write_from);
}

void BlockManager::admit(SeqId id, const PrefixHit& hit, int num_reused_tokens) {
  TESSERA_CHECK(seqs_.count(id) == 0) << "sequence " << id << " admitted twice";
  TESSERA_CHECK_LE(num_reused_tokens, hit.num_tokens(block_size_));
  SeqBlocks& s = seqs_[id];
  s.table = hit.blocks;
  s.num_filed = static_cast<int>(hit.blocks.size());
  s.last_hash = hit.blocks.empty() ? hit.root : hit.last_hash;
  for (int32_t b : hit.blocks) {
    Block& blk = blocks_[b];
    TESSERA_CHECK(blk.filed) << "hit block " << b << " is not in the prefix cache";
    if (blk.ref_count == 0) lru_remove(b);
    ++blk.ref_count;
  }
  prefix_hit_blocks_ += hit.blocks.size();
  prefix_hit_tokens_ += static_cast<uint64_t>(num_reused_tokens);
}

bool BlockManager::append_slots(SeqId id, int write_from, int end,
                                std::vector<std::pair<int32_t, int32_t>>* copies) {
  TESSERA_CHECK_LE(write_from, end);
  if (append_cost(id, write_from, end) > num_free_blocks()) return false;
  SeqBlocks& s = seq(id);
  const int needed = blocks_needed(end);
  if (write_from < end) {
    const int have = static_cast<int>(s.table.size());
    for (int k = write_from / block_size_; k < std::min(have, needed); ++k) {
      const int32_t src = s.table[k];
      if (blocks_[src].ref_count <= 1) continue;
      const int32_t dst = take_block();
      --blocks_[src].ref_count;  // still >= 1: the other owners keep it
      blocks_[dst].ref_count = 1;
      s.table[k] = dst;
      copies->emplace_back(src, dst);
      ++cow_copies_;
    }
  }
  while (static_cast<int>(s.table.size()) < needed) {
    const int32_t b = take_block();
    blocks_[b].ref_count = 1;
    s.table.push_back(b);
  }
  return true;
}

void BlockManager::commit(SeqId id, std::span<const int32_t> tokens, int num_computed) {
  SeqBlocks& s = seq(id);
  TESSERA_CHECK_LE(static_cast<size_t>(num_computed), tokens.size());
  TESSERA_CHECK_LE(blocks_needed(num_computed), static_cast<int>(s.table.size()))
      << "sequence " << id << " computed past its block table";
  const int full = num_computed / block_size_;
  for (int k = s.num_filed; k < full; ++k) {
    auto chunk = tokens.subspan(static_cast<size_t>(k) * block_size_, block_size_);
    const uint64_t h = hash_block_tokens(s.last_hash, chunk);
    const int32_t b = s.table[k];
    TESSERA_CHECK_GE(b, 0) << "sequence " << id << " computed into released block " << k;
    Block& blk = blocks_[b];
    // Keep the first copy of a prefix: another sequence may have filed the same content
    // in the meantime (a duplicate we simply do not index), and a shared block is filed.
    if (prefix_caching_ && !blk.filed && index_.count(h) == 0) {
      blk.filed = true;
      blk.hash = h;
      blk.parent_hash = s.last_hash;
      std::copy(chunk.begin(), chunk.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
      index_.emplace(h, b);
    }
    s.last_hash = h;
    s.num_filed = k + 1;
  }
}

void BlockManager::fork(SeqId parent, SeqId child) {
  TESSERA_CHECK(seqs_.count(child) == 0) << "sequence " << child << " already has blocks";
  SeqBlocks copy = seq(parent);
  for (int32_t b : copy.table)
    if (b >= 0) ++blocks_[b].ref_count;  // the released leading entries stay released
  seqs_.emplace(child, std::move(copy));
}

void BlockManager::free(SeqId id) {
  auto it = seqs_.find(id);
  TESSERA_CHECK(it != seqs_.end()) << "freeing sequence " << id << " with no block table";
  // Tail first: later blocks of a prefix are the least likely to be asked for again, so
  // they go nearest the eviction end of the LRU list.
  const SeqBlocks& s = it->second;
  for (int k = static_cast<int>(s.table.size()); k-- > s.num_released;) release(s.table[k]);
  seqs_.erase(it);
}

void BlockManager::truncate(SeqId id, int num_tokens) {
  SeqBlocks& s = seq(id);
  const int keep = std::max(blocks_needed(num_tokens), s.num_released);
  TESSERA_CHECK_LE(s.num_filed, keep) << "sequence " << id << " truncates blocks it has filed";
  while (static_cast<int>(s.table.size()) > keep) {
    release(s.table.back());
    s.table.pop_back();
  }
}

int BlockManager::release_blocks_before(SeqId id, int first_token) {
  SeqBlocks& s = seq(id);
  const int upto = std::max(0, first_token) / block_size_;
  if (upto <= s.num_released) return 0;
  // Only computed (committed) blocks: a later one may still be written, or read by the step
  // that fills it.
  TESSERA_CHECK_LE(upto, s.num_filed) << "sequence " << id << " releases blocks it has not computed";
  // Tail first, as free() does, for the same eviction order among the released blocks.
  for (int k = upto; k-- > s.num_released;) {
    release(s.table[k]);
    s.table[k] = -1;
  }
  const int n = upto - s.num_released;
  s.num_released = upto;
  window_releases_ += static_cast<uint64_t>(n);
  return n;
}

void BlockManager::forget_cached_contents() {
  TESSERA_CHECK(seqs_.empty()) << seqs_.size() << " sequences still own blocks";
  while (lru_head_ != -1) {
    const int32_t b = lru_head_;
    lru_remove(b);
    blocks_[b].filed = false;
    blocks_[b].hash = blocks_[b].parent_hash = 0;
    free_.push_back(b);
  }
  index_.clear();
}

void BlockManager::release(int32_t block) {
  Block& b = blocks_[block];
  TESSERA_CHECK_GT(b.ref_count, 0) << "block " << block << " released twice";
  if (--b.ref_count > 0) return;
  if (b.filed) {
    lru_push_back(block);
  } else {
    free_.push_back(block);
  }
}

int32_t BlockManager::take_block() {
  ++blocks_allocated_;
  if (!free_.empty()) {
    const int32_t b = free_.back();
    free_.pop_back();
    return b;
  }
  TESSERA_CHECK_NE(lru_head_, -1) << "KV block pool exhausted (callers must check the cost first)";
  const int32_t b = lru_head_;
  lru_remove(b);
  Block& blk = blocks_[b];
  index_.erase(blk.hash);
  blk.filed = false;
  blk.hash = blk.parent_hash = 0;
  ++evictions_;
  return b;
}

void BlockManager::lru_push_back(int32_t block) {
  Block& b = blocks_[block];
  b.in_lru = true;
  b.lru_prev = lru_tail_;
  b.lru_next = -1;
  if (lru_tail_ != -1) {
    blocks_[lru_tail_].lru_next = block;
  } else {
    lru_head_ = block;
  }
  lru_tail_ = block;
  ++num_cached_;
}

void BlockManager::lru_remove(int32_t block) {
  Block& b = blocks_[block];
  TESSERA_CHECK(b.in_lru) << "block " << block << " is not cached";
  if (b.lru_prev != -1) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    lru_head_ = b.lru_next;
  }
  if (b.lru_next != -1) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    lru_tail_ = b.lru_prev;
  }
  b.in_lru = false;
  b.lru_prev = b.lru_next = -1;
  --num_cached_;
}

const std::vector<int32_t>& BlockManager::block_table(SeqId id) const { return seq(id).table; }

int BlockManager::num_held_blocks(SeqId id) const {
  const SeqBlocks& s = seq(id);
  return static_cast<int>(s.table.size()) - s.num_released;
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.num_blocks = num_blocks_;
  s.num_free = num_free_blocks();
  s.num_cached = num_cached_;
  s.num_sequences = static_cast<int>(seqs_.size());
  s.prefix_hit_blocks = prefix_hit_blocks_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.cow_copies = cow_copies_;
  s.blocks_allocated = blocks_allocated_;
  s.evictions = evictions_;
  s.window_releases = window_releases_;
  return s;
}

void BlockManager::check_invariants() const {
  enum Place : uint8_t { kNowhere, kFree, kCached };
  std::vector<uint8_t> place(static_cast<size_t>(num_blocks_), kNowhere);
  for (int32_t b : free_) {
    TESSERA_CHECK(b >= 0 && b < num_blocks_) << "bad block id " << b << " on the free stack";
    TESSERA_CHECK_EQ(int{place[b]}, int{kNowhere}) << "block " << b << " twice on the free stack";
    TESSERA_CHECK(!blocks_[b].filed && !blocks_[b].in_lru) << "free block " << b << " is cached";
    place[b] = kFree;
  }
  int cached = 0;
  int32_t prev = -1;
  for (int32_t b = lru_head_; b != -1; b = blocks_[b].lru_next) {
    TESSERA_CHECK_EQ(int{place[b]}, int{kNowhere}) << "cached block " << b << " also elsewhere";
    TESSERA_CHECK(blocks_[b].in_lru && blocks_[b].filed) << "LRU block " << b << " not marked cached";
    TESSERA_CHECK_EQ(blocks_[b].lru_prev, prev) << "LRU links broken at block " << b;
    place[b] = kCached;
    prev = b;
    ++cached;
    TESSERA_CHECK_LE(cached, num_blocks_) << "LRU list has a cycle";
  }
  TESSERA_CHECK_EQ(prev, lru_tail_);
  TESSERA_CHECK_EQ(cached, num_cached_);

  std::vector<int32_t> owners(static_cast<size_t>(num_blocks_), 0);
  std::vector<SeqId> last_seen(static_cast<size_t>(num_blocks_), 0);
  std::vector<uint8_t> seen_in_any(static_cast<size_t>(num_blocks_), 0);
  for (const auto& [id, s] : seqs_) {
    TESSERA_CHECK_LE(s.num_filed, static_cast<int>(s.table.size())) << "sequence " << id;
    TESSERA_CHECK(s.num_released >= 0 && s.num_released <= s.num_filed) << "sequence " << id << " released "
                                                                         << s.num_released << " blocks";
    for (size_t k = 0; k < s.table.size(); ++k) {
      const int32_t b = s.table[k];
      if (static_cast<int>(k) < s.num_released) {
        TESSERA_CHECK_EQ(b, -1) << "sequence " << id << " kept released block " << k;
        continue;
      }
      TESSERA_CHECK(b >= 0 && b < num_blocks_) << "sequence " << id << " lists bad block " << b;
      TESSERA_CHECK(!(seen_in_any[b] && last_seen[b] == id))
          << "sequence " << id << " lists block " << b << " twice";
      seen_in_any[b] = 1;
      last_seen[b] = id;
      ++owners[b];
    }
  }
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[b];
    TESSERA_CHECK_EQ(blk.ref_count, owners[b]) << "block " << b << " ref count vs owning sequences";
    if (owners[b] > 0) {
      TESSERA_CHECK_EQ(int{place[b]}, int{kNowhere}) << "owned block " << b << " is also free/cached";
    } else {
      TESSERA_CHECK_NE(int{place[b]}, int{kNowhere}) << "block " << b << " is lost (no owner, not free)";
    }
    if (blk.filed) {
      auto it = index_.find(blk.hash);
      TESSERA_CHECK(it != index_.end() && it->second == b) << "filed block " << b << " not indexed";
      TESSERA_CHECK_EQ(hash_block_tokens(blk.parent_hash, block_tokens(b)), blk.hash)
          << "block " << b << " content does not match its hash";
    }
  }
  for (const auto& [h, b] : index_) {
    TESSERA_CHECK(blocks_[b].filed && blocks_[b].hash == h) << "stale index entry for block " << b;
  }
  TESSERA_CHECK_EQ(static_cast<int>(free_.size()) + num_cached_ +
                       static_cast<int>(std::count_if(owners.begin(), owners.end(), [](int32_t n) { return n > 0; })),
                   num_blocks_);
}

}  // namespace tessera
