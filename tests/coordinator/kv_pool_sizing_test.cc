// cache.num_blocks "auto": the pool follows what every rank reports
// (coordinator/cluster/kv_pool_sizing.h).
#include "coordinator/cluster/kv_pool_sizing.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

wire::Register rank_report(int rank, const std::string& backend, int64_t free_bytes) {
  wire::Register r;
  r.rank = rank;
  r.backend = backend;
  r.free_memory_bytes = static_cast<uint64_t>(free_bytes);
  r.total_memory_bytes = static_cast<uint64_t>(free_bytes) * 2;
  r.host = "h" + std::to_string(rank);
  return r;
}

KvPoolModel model(int world, int64_t per_block, int64_t weights) {
  KvPoolModel m;
  m.bytes_per_block.assign(world, per_block);
  m.weight_bytes.assign(world, weights);
  m.block_size = 16;
  m.max_model_len = 1024;  // 64 blocks per sequence
  m.max_num_seqs = 1 << 16;
  return m;
}

TEST(KvPoolSizing, CpuBudgetIsCpuKvBytesOverBytesPerBlock) {
  CacheSection cache;
  cache.cpu_kv_bytes = 64 * kMiB;
  auto pool = size_kv_pool(cache, model(1, 64 * 1024, 10 * kMiB), {rank_report(0, "cpu", 20 * kGiB)});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ(pool->num_blocks, 64 * kMiB / (64 * 1024));
  EXPECT_EQ(pool->describe(),
            "cache: 1024 blocks of 16 tokens (auto: cache.cpu_kv_bytes 64.0 MiB of 20.0 GiB available reported by "
            "rank 0)");
}

TEST(KvPoolSizing, CpuDefaultIsTwoGiBOrATenthOfWhatTheRankReports) {
  CacheSection cache;  // cpu_kv_bytes auto
  auto big = size_kv_pool(cache, model(1, kMiB, 0), {rank_report(0, "cpu", 100 * kGiB)});
  ASSERT_TRUE(big.is_ok());
  EXPECT_EQ(big->num_blocks, 2048);  // 2 GiB
  auto small = size_kv_pool(cache, model(1, kMiB, 0), {rank_report(0, "cpu", 5 * kGiB)});
  ASSERT_TRUE(small.is_ok());
  EXPECT_EQ(small->num_blocks, 512);  // 10% of 5 GiB = 0.5 GiB
  EXPECT_NE(small->source.find("cache.cpu_kv_bytes auto (min(2 GiB, 10% of available)) 512.0 MiB"), std::string::npos)
      << small->source;
}

TEST(KvPoolSizing, CpuBudgetIsCappedByTheReportedMemoryLessWeights) {
  CacheSection cache;
  cache.cpu_kv_bytes = 1024 * kGiB;
  auto pool = size_kv_pool(cache, model(1, kMiB, 100 * kMiB), {rank_report(0, "cpu", 612 * kMiB)});
  ASSERT_TRUE(pool.is_ok());
  EXPECT_EQ(pool->num_blocks, 512);
  EXPECT_NE(pool->source.find("cache.cpu_kv_bytes 1.0 TiB capped to 512.0 MiB: the 612.0 MiB available reported by "
                              "rank 0 less 100.0 MiB of weights"),
            std::string::npos)
      << pool->source;
}

// The largest step's activations come out of the room too: a worker whose pool took all its
// weights left was killed by its container's limit at its first large step.
TEST(KvPoolSizing, CpuAndCudaBudgetsLeaveTheLargestStepsActivations) {
  CacheSection cache;
  cache.cpu_kv_bytes = 1024 * kGiB;
  KvPoolModel m = model(1, kMiB, 100 * kMiB);
  m.activation_bytes = {200 * kMiB};
  m.activation_step = "a step of 4096 tokens and 256 rows of logits";
  auto pool = size_kv_pool(cache, m, {rank_report(0, "cpu", 612 * kMiB)});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ(pool->num_blocks, 312);
  EXPECT_NE(pool->source.find("capped to 312.0 MiB: the 612.0 MiB available reported by rank 0 less 100.0 MiB of "
                              "weights and 200.0 MiB of activations (a step of 4096 tokens and 256 rows of logits)"),
            std::string::npos)
      << pool->source;

  cache.memory_fraction = 0.5;
  auto device = size_kv_pool(cache, m, {rank_report(0, "cuda", 1024 * kMiB)});
  ASSERT_TRUE(device.is_ok()) << device.status().to_string();
  EXPECT_EQ(device->num_blocks, 512 - 300);

  // Nothing left for one sequence: the error names the activations and the key that sets them.
  m.activation_bytes = {500 * kMiB};
  auto none = size_kv_pool(cache, m, {rank_report(0, "cpu", 612 * kMiB)});
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("500.0 MiB of activations"), std::string::npos) << none.status().to_string();
  EXPECT_NE(none.status().message().find("scheduler.max_num_batched_tokens"), std::string::npos);
}

TEST(KvPoolSizing, CudaTakesTheMemoryFractionOfFreeLessWeights) {
  CacheSection cache;
  cache.memory_fraction = 0.5;
  cache.cpu_kv_bytes = kMiB;  // not a CUDA rank's business
  auto pool = size_kv_pool(cache, model(1, kMiB, kGiB), {rank_report(0, "cuda", 10 * kGiB)});
  ASSERT_TRUE(pool.is_ok());
  EXPECT_EQ(pool->num_blocks, 4 * 1024);  // 5 GiB - 1 GiB
  EXPECT_NE(pool->source.find("cache.memory_fraction 0.5 of the 10.0 GiB free reported by rank 0 (cuda)"),
            std::string::npos);
}

TEST(KvPoolSizing, TheSmallestRankDecidesWithItsOwnBytesPerBlock) {
  CacheSection cache;
  cache.memory_fraction = 1.0;
  KvPoolModel m = model(3, kMiB, 0);
  m.bytes_per_block[2] = 2 * kMiB;  // a rank holding more KV heads
  auto pool = size_kv_pool(cache, m,
                           {rank_report(0, "cuda", 8 * kGiB), rank_report(1, "cuda", 3 * kGiB),
                            rank_report(2, "cuda", 4 * kGiB)});
  ASSERT_TRUE(pool.is_ok());
  EXPECT_EQ(pool->num_blocks, 2048);  // rank 2: 4 GiB / 2 MiB (rank 1: 3072)
  EXPECT_NE(pool->source.find("reported by rank 2"), std::string::npos) << pool->source;
}

TEST(KvPoolSizing, AtMostWhatMaxNumSeqsSequencesNeed) {
  CacheSection cache;
  cache.cpu_kv_bytes = 10 * kGiB;
  KvPoolModel m = model(1, kMiB, 0);
  m.max_num_seqs = 3;
  auto pool = size_kv_pool(cache, m, {rank_report(0, "cpu", 100 * kGiB)});
  ASSERT_TRUE(pool.is_ok());
  EXPECT_EQ(pool->num_blocks, 3 * 64);
  EXPECT_NE(pool->source.find("capped at the 192 blocks scheduler.max_num_seqs 3 sequences of 1024 tokens need"),
            std::string::npos);
}

TEST(KvPoolSizing, TooLittleMemoryForOneSequenceIsAnErrorNamingTheRank) {
  CacheSection cache;
  cache.cpu_kv_bytes = 10 * kMiB;  // 10 blocks; one sequence needs 64
  auto pool = size_kv_pool(cache, model(2, kMiB, 0), {rank_report(0, "cpu", kGiB), rank_report(1, "cpu", kGiB)});
  ASSERT_FALSE(pool.is_ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(pool.status().message().find("holds 10 blocks of 1.0 MiB, fewer than the 64 one 1024-token sequence needs"),
            std::string::npos)
      << pool.status().message();
  auto odd = size_kv_pool(cache, model(1, kMiB, 0), {rank_report(0, "tpu", kGiB)});
  ASSERT_FALSE(odd.is_ok());
  EXPECT_NE(odd.status().message().find("backend 'tpu'"), std::string::npos);
}

TEST(KvPoolSizing, ALaterRankMustHoldThePoolTheGroupWasSizedWith) {
  CacheSection cache;
  cache.cpu_kv_bytes = 256 * kMiB;
  const KvPoolModel m = model(2, kMiB, 0);
  auto pool = size_kv_pool(cache, m, {rank_report(0, "cpu", 8 * kGiB), rank_report(1, "cpu", 8 * kGiB)});
  ASSERT_TRUE(pool.is_ok());
  EXPECT_TRUE(check_rank_fits_kv_pool(cache, m, *pool, rank_report(1, "cpu", 4 * kGiB)).is_ok());
  Status st = check_rank_fits_kv_pool(cache, m, *pool, rank_report(1, "cpu", 100 * kMiB));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("rank 1 (host h1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("the 100.0 MiB available reported by rank 1 less 0 bytes of weights holds 100 KV "
                              "blocks, fewer than the 256 of the pool"),
            std::string::npos)
      << st.message();
}

// With the auto share (a tenth of what a rank reports) the pool is sized from the first
// reports; a rank restarted later reports a little less (its container's memory moved by a
// few MiB) and must still be taken while its memory holds the pool.
TEST(KvPoolSizing, ARestartedRankReportingALittleLessStillHoldsTheAutoPool) {
  CacheSection cache;  // cpu_kv_bytes auto
  KvPoolModel m = model(1, 352 * 1024, 774 * kMiB);
  m.activation_bytes = {210 * kMiB};
  const int64_t reported = 1126 * kMiB;
  auto pool = size_kv_pool(cache, m, {rank_report(0, "cpu", reported)});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ(pool->num_blocks, static_cast<int64_t>(0.1 * reported) / (352 * 1024));
  EXPECT_TRUE(check_rank_fits_kv_pool(cache, m, *pool, rank_report(0, "cpu", reported - 3 * kMiB)).is_ok());
  // Less than the weights, the activations and the pool need: refused.
  const int64_t pool_bytes = pool->num_blocks * 352 * 1024;
  Status st = check_rank_fits_kv_pool(cache, m, *pool, rank_report(0, "cpu", 984 * kMiB + pool_bytes - kMiB));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("less 774.0 MiB of weights and 210.0 MiB of activations"), std::string::npos)
      << st.message();
}

TEST(KvPoolSizing, BytesAreFormattedInBinaryUnits) {
  EXPECT_EQ(format_bytes(4096), "4.0 KiB");
  EXPECT_EQ(format_bytes(1000), "1000 bytes");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.5 GiB");
}

}  // namespace
}  // namespace tessera
