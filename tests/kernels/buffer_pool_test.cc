// The CPU backend's activation pool (kernels/cpu/buffer_pool.h): buffers come back zeroed
// whatever their last user wrote, freed buffers are reused by size class, the cache stays
// under its cap, and buffers outlive the pool that made them.
#include "kernels/cpu/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace tessera::cpu {
namespace {

bool pool_buffer_is_zero(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.view().data);
  for (size_t i = 0; i < t.nbytes(); ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST(BufferPool, SizeClassesAreAtMostAQuarterAboveTheRequest) {
  for (size_t bytes : {size_t{1}, size_t{256}, size_t{257}, size_t{4096}, size_t{5000}, size_t{1} << 20,
                       (size_t{1} << 20) + 1, size_t{12345678}}) {
    const size_t cls = BufferPool::size_class(bytes);
    EXPECT_GE(cls, bytes);
    EXPECT_EQ(cls % 64, 0u) << bytes;
    if (bytes > 256) {
      EXPECT_LE(cls, bytes + bytes / 4 + 64) << bytes;
    }
  }
  // Nearby requests share a class (so a prefill chunk of 511 tokens reuses one of 512).
  EXPECT_EQ(BufferPool::size_class(511 * 3072), BufferPool::size_class(512 * 3072));
}

TEST(BufferPool, ReusedBuffersComeBackZeroed) {
  auto pool = BufferPool::create();
  for (int64_t rows : {1, 64, 512}) {  // heap-sized and mmap-sized buffers
    void* first = nullptr;
    {
      Tensor t = pool->zeros({rows, 3000}, DType::kF32);
      ASSERT_TRUE(pool_buffer_is_zero(t));
      first = t.view().data;
      std::memset(first, 0xAB, t.nbytes());
    }
    EXPECT_GT(pool->cached_bytes(), 0u);
    Tensor again = pool->zeros({rows, 3000}, DType::kF32);
    EXPECT_EQ(again.view().data, first) << "a freed buffer of the same class is reused";
    EXPECT_TRUE(pool_buffer_is_zero(again)) << rows << " rows";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(again.view().data) % 64, 0u);
  }
}

// A shape not seen before takes a cached buffer up to 4x its size (zeroed to its own size),
// which goes back under its own class; anything smaller gets memory of its own.
TEST(BufferPool, SmallerRequestsReuseBuffersUpToFourTimesTheirSize) {
  auto pool = BufferPool::create();
  void* big = nullptr;
  size_t big_class = 0;
  {
    Tensor t = pool->zeros({512, 768}, DType::kF32);
    big = t.view().data;
    big_class = BufferPool::size_class(t.nbytes());
    std::memset(big, 0xAB, t.nbytes());
  }
  {
    Tensor smaller = pool->zeros({160, 768}, DType::kF32);  // 3.2x smaller
    EXPECT_EQ(smaller.view().data, big);
    EXPECT_TRUE(pool_buffer_is_zero(smaller));
    EXPECT_EQ(pool->cached_bytes(), 0u);
    Tensor tiny = pool->zeros({100, 768}, DType::kF32);  // 5.1x smaller: its own
    EXPECT_NE(tiny.view().data, big);
  }
  EXPECT_EQ(pool->cached_bytes(), big_class + BufferPool::size_class(100 * 768 * 4));
  Tensor again = pool->zeros({512, 768}, DType::kF32);
  EXPECT_EQ(again.view().data, big) << "returned under its own class";
}

TEST(BufferPool, BuffersTooLargeToPoolAreNotCachedAndTheCacheIsCapped) {
  auto pool = BufferPool::create();
  { Tensor big = pool->zeros({static_cast<int64_t>(BufferPool::kMaxPooledBytes / 4 + 1)}, DType::kF32); }
  EXPECT_EQ(pool->cached_bytes(), 0u);
  {
    std::vector<Tensor> many;
    // 8 x 192 MiB: more than the 1 GiB cap once freed. Lazily zero pages: no memory is touched.
    for (int i = 0; i < 8; ++i) many.push_back(pool->zeros({int64_t{48} << 20}, DType::kF32));
  }
  EXPECT_LE(pool->cached_bytes(), BufferPool::kMaxCachedBytes);
  EXPECT_GT(pool->cached_bytes(), 0u);
}

// With a limit (the worker's planned activations) buffers in use and free ones together stay
// within it: steps of shapes the cache cannot serve send free buffers back first; only buffers
// in use beyond the limit take the pool past it, and those are not kept once freed.
TEST(BufferPool, ALimitHoldsBuffersInUseAndFreeTogether) {
  auto pool = BufferPool::create();
  const size_t limit = size_t{8} << 20;
  pool->set_limit(limit);
  // Steps of ever new shapes (no cached class serves the next one), each within the limit.
  for (int64_t rows = 64; rows <= 500; rows = rows * 3 / 2) {  // 64 .. 486 rows: 1 to 8 MiB a step
    std::vector<Tensor> step;
    for (int b = 0; b < 4; ++b) step.push_back(pool->zeros({rows, 1024}, DType::kF32));  // 4 x rows x 4 KiB
    EXPECT_LE(pool->in_use_bytes() + pool->cached_bytes(), limit) << rows << " rows";
  }
  EXPECT_LE(pool->peak_held_bytes(), limit);
  EXPECT_GT(pool->cached_bytes(), 0u) << "what fits stays cached";
  // One step beyond the limit: it gets its memory, and gives back what is over once freed.
  {
    std::vector<Tensor> big;
    for (int b = 0; b < 3; ++b) big.push_back(pool->zeros({1024, 1024}, DType::kF32));  // 12 MiB
    EXPECT_GE(pool->in_use_bytes(), size_t{12} << 20);
    EXPECT_EQ(pool->cached_bytes(), 0u) << "free buffers went back before the pool grew past its limit";
  }
  EXPECT_EQ(pool->in_use_bytes(), 0u);
  EXPECT_LE(pool->cached_bytes(), limit);
  // Lowering the limit sends free buffers back at once.
  pool->set_limit(size_t{1} << 20);
  EXPECT_LE(pool->cached_bytes(), size_t{1} << 20);
}

TEST(BufferPool, TensorsOutliveTheBackendThatAllocatedThem) {
  Tensor kept;
  {
    CpuBackend backend(1);
    kept = backend.alloc({256, 256}, DType::kF32);
    kept.data<float>()[0] = 1.0f;
  }
  EXPECT_EQ(kept.data<float>()[0], 1.0f);  // the pool lives while a buffer of it does (ASan checks)
}

}  // namespace
}  // namespace tessera::cpu
