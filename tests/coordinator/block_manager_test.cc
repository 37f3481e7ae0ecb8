// BlockManager: exact free counts, prefix sharing by content hash, copy-on-write, eviction,
// blocks given back behind a sliding window.
#include "coordinator/engine/block_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace tessera {
namespace {

using Copies = std::vector<std::pair<int32_t, int32_t>>;

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Admits `id` with whatever prefix the cache holds and allocates room for all of `tokens`,
// computing them (commit) as an executor step would.
PrefixHit admit_and_compute(BlockManager& bm, SeqId id, const std::vector<int32_t>& tokens, Copies* copies,
                            uint64_t root = kRootPrefixHash) {
  PrefixHit hit = bm.find_cached_prefix(tokens, root);
  const int cached = std::min(hit.num_tokens(bm.block_size()), static_cast<int>(tokens.size()) - 1);
  bm.admit(id, hit, cached);
  EXPECT_TRUE(bm.append_slots(id, cached, static_cast<int>(tokens.size()), copies));
  bm.commit(id, tokens, static_cast<int>(tokens.size()));
  bm.check_invariants();
  return hit;
}

TEST(BlockManagerTest, PrefixesAreSharedOnlyWithinOneLoraAdapter) {
  BlockManager bm(4, 32);
  Copies copies;
  const std::vector<int32_t> prompt = iota_tokens(13, 100);  // 3 full blocks
  EXPECT_TRUE(admit_and_compute(bm, 1, prompt, &copies, prefix_root("psalms")).blocks.empty());
  // The same tokens under the base model or another adapter are other KV.
  EXPECT_TRUE(bm.find_cached_prefix(prompt).blocks.empty());
  EXPECT_TRUE(bm.find_cached_prefix(prompt, prefix_root("proverbs")).blocks.empty());
  EXPECT_EQ(bm.find_cached_prefix(prompt, prefix_root("psalms")).blocks.size(), 3u);
  EXPECT_TRUE(admit_and_compute(bm, 2, prompt, &copies).blocks.empty());
  EXPECT_EQ(admit_and_compute(bm, 3, prompt, &copies, prefix_root("psalms")).blocks.size(), 3u);
  EXPECT_EQ(admit_and_compute(bm, 4, prompt, &copies).blocks.size(), 3u);
  EXPECT_EQ(prefix_root(""), kRootPrefixHash);
  EXPECT_NE(prefix_root("a"), prefix_root("b"));
}

TEST(BlockManagerTest, FreeCountIsExactThroughAllocAppendAndFree) {
  BlockManager bm(16, 8);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  Copies copies;
  bm.admit(1, {}, 0);
  EXPECT_EQ(bm.append_cost(1, 0, 40), 3);
  ASSERT_TRUE(bm.append_slots(1, 0, 40, &copies));
  EXPECT_EQ(bm.block_table(1).size(), 3u);
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_EQ(bm.append_cost(1, 40, 48), 0);  // the third block still has room
  ASSERT_TRUE(bm.append_slots(1, 40, 48, &copies));
  EXPECT_EQ(bm.num_free_blocks(), 5);
  ASSERT_TRUE(bm.append_slots(1, 48, 49, &copies));
  EXPECT_EQ(bm.num_free_blocks(), 4);
  bm.check_invariants();

  bm.admit(2, {}, 0);
  EXPECT_EQ(bm.max_appendable_tokens(2, 0), 64);
  EXPECT_FALSE(bm.append_slots(2, 0, 65, &copies));  // 5 blocks > 4 free: nothing changes
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_TRUE(bm.block_table(2).empty());
  ASSERT_TRUE(bm.append_slots(2, 0, 64, &copies));
  EXPECT_EQ(bm.num_free_blocks(), 0);
  bm.check_invariants();

  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  bm.free(2);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_TRUE(copies.empty());
  bm.check_invariants();
}

TEST(BlockManagerTest, SharedPrefixOf64TokensIsAllocatedOnce) {
  BlockManager bm(16, 32);
  const std::vector<int32_t> prefix = iota_tokens(64, 1000);
  std::vector<int32_t> a = prefix, b = prefix;
  for (int i = 0; i < 10; ++i) a.push_back(7 + i);
  for (int i = 0; i < 7; ++i) b.push_back(50 + i);
  Copies copies;

  PrefixHit hit_a = admit_and_compute(bm, 1, a, &copies);
  EXPECT_TRUE(hit_a.blocks.empty());
  EXPECT_EQ(bm.num_free_blocks(), 32 - 5);  // 74 tokens = 4 full blocks + 1 partial

  PrefixHit hit_b = bm.find_cached_prefix(b);
  ASSERT_EQ(hit_b.blocks.size(), 4u);
  EXPECT_EQ(hit_b.num_tokens(16), 64);
  EXPECT_EQ(hit_b.num_evictable, 0);
  EXPECT_EQ(bm.admission_cost(hit_b, 64, 71), 1);  // only B's own tail block
  bm.admit(2, hit_b, 64);
  ASSERT_TRUE(bm.append_slots(2, 64, 71, &copies));
  bm.commit(2, b, 71);
  bm.check_invariants();

  // The four prefix blocks exist once, shared: 5 (A) + 1 (B's tail) blocks in use.
  EXPECT_EQ(bm.num_free_blocks(), 32 - 6);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(bm.block_table(2)[k], bm.block_table(1)[k]);
    EXPECT_EQ(bm.ref_count(bm.block_table(1)[k]), 2);
  }
  EXPECT_NE(bm.block_table(2)[4], bm.block_table(1)[4]);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.stats().prefix_hit_blocks, 4u);
  EXPECT_EQ(bm.stats().prefix_hit_tokens, 64u);

  // A longer identical prefix is not enough when an earlier block differs: hashes chain.
  std::vector<int32_t> c = prefix;
  c[3] = -5;
  EXPECT_TRUE(bm.find_cached_prefix(c).blocks.empty());
  std::vector<int32_t> d = prefix;
  d[40] = -5;  // third block differs: the first two still hit
  EXPECT_EQ(bm.find_cached_prefix(d).blocks.size(), 2u);
}

TEST(BlockManagerTest, FreedPrefixBlocksStayCachedCountAsFreeAndAreEvictedLast) {
  BlockManager bm(4, 6);
  Copies copies;
  const std::vector<int32_t> a = iota_tokens(10, 0);  // 2 full blocks + 1 partial
  admit_and_compute(bm, 1, a, &copies);
  bm.free(1);
  EXPECT_EQ(bm.num_free_blocks(), 6);  // cached blocks count as free
  EXPECT_EQ(bm.stats().num_cached, 2);
  bm.check_invariants();

  // Reusing them takes them out of the free pool: the cost counts them.
  PrefixHit hit = bm.find_cached_prefix(a);
  ASSERT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.num_evictable, 2);
  EXPECT_EQ(bm.admission_cost(hit, 8, 10), 3);
  bm.admit(2, hit, 8);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  bm.free(2);

  // A different sequence needing the whole pool evicts them instead of failing.
  const std::vector<int32_t> other = iota_tokens(24, 500);
  admit_and_compute(bm, 3, other, &copies);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(bm.stats().evictions, 2u);
  EXPECT_TRUE(bm.find_cached_prefix(a).blocks.empty());
  bm.free(3);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  bm.check_invariants();
}

TEST(BlockManagerTest, FullPrefixHitCopiesTheLastBlockBeforeRewritingIt) {
  BlockManager bm(16, 8);
  Copies copies;
  const std::vector<int32_t> prompt = iota_tokens(32, 1);
  admit_and_compute(bm, 1, prompt, &copies);
  ASSERT_TRUE(copies.empty());

  // The same 32 tokens: both blocks hit, but the last token must be recomputed (for logits),
  // which writes into the shared second block: it is copied first.
  PrefixHit hit = bm.find_cached_prefix(prompt);
  ASSERT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(bm.admission_cost(hit, 31, 32), 1);
  bm.admit(2, hit, 31);
  ASSERT_TRUE(bm.append_slots(2, 31, 32, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, bm.block_table(1)[1]);
  EXPECT_EQ(copies[0].second, bm.block_table(2)[1]);
  EXPECT_EQ(bm.block_table(2)[0], bm.block_table(1)[0]);
  EXPECT_EQ(bm.ref_count(bm.block_table(1)[0]), 2);
  EXPECT_EQ(bm.ref_count(bm.block_table(1)[1]), 1);
  EXPECT_EQ(bm.num_free_blocks(), 8 - 3);
  EXPECT_EQ(bm.stats().cow_copies, 1u);
  bm.check_invariants();
}

TEST(BlockManagerTest, ForkSharesEverythingAndCopiesOnFirstWrite) {
  BlockManager bm(4, 8);
  Copies copies;
  const std::vector<int32_t> a = iota_tokens(6, 0);  // one full block + a half-filled one
  admit_and_compute(bm, 1, a, &copies);
  bm.fork(1, 2);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  bm.check_invariants();
  EXPECT_EQ(bm.append_cost(2, 6, 7), 1);
  ASSERT_TRUE(bm.append_slots(2, 6, 7, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, bm.block_table(1)[1]);
  EXPECT_EQ(bm.append_cost(1, 6, 7), 0);  // the parent owns its block alone again
  EXPECT_EQ(bm.block_table(1)[0], bm.block_table(2)[0]);
  bm.check_invariants();
  bm.free(1);
  bm.free(2);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  bm.check_invariants();
}

TEST(BlockManagerTest, PrefixCachingOffNeverHits) {
  BlockManager bm(4, 8, /*prefix_caching=*/false);
  Copies copies;
  const std::vector<int32_t> a = iota_tokens(12, 0);
  admit_and_compute(bm, 1, a, &copies);
  EXPECT_TRUE(bm.find_cached_prefix(a).blocks.empty());
  bm.free(1);
  EXPECT_EQ(bm.stats().num_cached, 0);
  EXPECT_EQ(bm.num_free_blocks(), 8);
}

// A sliding window gives back leading blocks: a shared one just loses a reference, a filed
// one stays in the prefix cache (and is hit again), the free count stays exact, and free(),
// fork() and a later admission treat the -1 entries as gone.
TEST(BlockManagerTest, ReleasingBlocksBeforeAWindowKeepsSharingAndCountsExact) {
  BlockManager bm(4, 16);
  Copies copies;
  const std::vector<int32_t> a = iota_tokens(16, 0);  // 4 full blocks
  admit_and_compute(bm, 1, a, &copies);
  std::vector<int32_t> b = a;
  b.insert(b.end(), {90, 91, 92, 93});
  admit_and_compute(bm, 2, b, &copies);  // shares a's 4 blocks, adds 1
  EXPECT_EQ(bm.num_free_blocks(), 11);
  const std::vector<int32_t> shared = bm.block_table(1);

  // Sequence 1's window starts at token 9: blocks 0 and 1 go, but sequence 2 still owns them.
  EXPECT_EQ(bm.release_blocks_before(1, 9), 2);
  EXPECT_EQ(bm.block_table(1), (std::vector<int32_t>{-1, -1, shared[2], shared[3]}));
  EXPECT_EQ(bm.num_held_blocks(1), 2);
  EXPECT_EQ(bm.ref_count(shared[0]), 1);
  EXPECT_EQ(bm.num_free_blocks(), 11);
  EXPECT_EQ(bm.release_blocks_before(1, 11), 0);  // nothing more lies wholly before token 11
  bm.check_invariants();

  // Sequence 2's starts at token 13: blocks 0 and 1 are nobody's now (cached: they are
  // filed), block 2 is still sequence 1's.
  EXPECT_EQ(bm.release_blocks_before(2, 13), 3);
  EXPECT_EQ(bm.num_free_blocks(), 13);
  EXPECT_EQ(bm.stats().num_cached, 2);
  EXPECT_EQ(bm.ref_count(shared[2]), 1);
  EXPECT_EQ(bm.stats().window_releases, 5u);
  bm.check_invariants();

  // A third sequence still finds the whole 16-token prefix (two blocks cached, two owned).
  // Admitted with its window at token 12, the two cached hits go straight back, so they cost
  // nothing; only the copy of the shared last block it rewrites (token 15, for logits) does.
  const PrefixHit hit = bm.find_cached_prefix(a);
  ASSERT_EQ(hit.blocks, shared);
  EXPECT_EQ(hit.num_evictable, 2);
  EXPECT_EQ(bm.admission_cost(hit, 15, 16), 3);
  EXPECT_EQ(bm.admission_cost(hit, 15, 16, /*first_token=*/12), 1);
  bm.admit(3, hit, 15);
  EXPECT_EQ(bm.release_blocks_before(3, 12), 3);
  ASSERT_TRUE(bm.append_slots(3, 15, 16, &copies));
  EXPECT_EQ(bm.num_free_blocks(), 12);  // exactly the one block the cost said
  bm.check_invariants();

  bm.fork(3, 4);  // the child shares what the parent holds, not what it gave back
  EXPECT_EQ(bm.num_held_blocks(4), 1);
  bm.check_invariants();
  for (SeqId id : {SeqId{1}, SeqId{2}, SeqId{3}, SeqId{4}}) bm.free(id);
  EXPECT_EQ(bm.num_free_blocks(), 16);
  bm.check_invariants();
}

}  // namespace
}  // namespace tessera
