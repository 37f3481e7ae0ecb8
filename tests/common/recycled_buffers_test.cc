// RecycledBuffers: a buffer comes back to the pool when the last copy of its tensor goes and
// is handed out again for a request it can hold (the smallest such); live tensors never share
// memory; a tensor outlives the pool.
#include "common/recycled_buffers.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include <gtest/gtest.h>

namespace tessera {
namespace {

uintptr_t at(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data<char>()); }

TEST(RecycledBuffers, HandsABufferOutAgainOnceItsTensorsAreGone) {
  RecycledBuffers pool;
  Tensor a = pool.take({1000, 3000}, DType::kU8);  // 3 MB: a mapping of its own
  ASSERT_EQ(at(a) % 64, 0u);
  EXPECT_EQ(a.dim(0), 1000);
  EXPECT_EQ(a.dim(1), 3000);
  std::memset(a.data<char>(), 7, a.nbytes());
  const uintptr_t first = at(a);
  Tensor copy = a;
  a = Tensor();
  EXPECT_EQ(pool.free_bytes(), 0u) << "a copy still holds it";
  Tensor b = pool.take({10, 10}, DType::kF32);
  EXPECT_NE(at(b), first) << "a live tensor's buffer was handed out";
  copy = Tensor();
  EXPECT_EQ(pool.free_bytes(), size_t{3000000});
  Tensor c = pool.take({2000, 1000}, DType::kBF16);  // 4 MB: more than the free buffer holds
  EXPECT_NE(at(c), first);
  Tensor d = pool.take({500, 1000}, DType::kF32);  // 2 MB fits the 3 MB one
  EXPECT_EQ(at(d), first);
  EXPECT_EQ(d.data<char>()[0], 7) << "recycled, not cleared";
  EXPECT_EQ(pool.free_bytes(), 0u);
}

TEST(RecycledBuffers, TakesTheSmallestFreeBufferThatFits) {
  RecycledBuffers pool;
  Tensor big = pool.take({4 << 20}, DType::kU8);
  Tensor small = pool.take({1 << 20}, DType::kU8);
  const uintptr_t big_at = at(big), small_at = at(small);
  big = Tensor();
  small = Tensor();
  EXPECT_EQ(at(pool.take({1000}, DType::kU8)), small_at);  // dropped again at once
  Tensor mid = pool.take({2 << 20}, DType::kU8);
  EXPECT_EQ(at(mid), big_at);
}

TEST(RecycledBuffers, ATensorOutlivesThePool) {
  Tensor kept;
  {
    RecycledBuffers pool;
    kept = pool.take({256}, DType::kF32);
    std::memset(kept.data<char>(), 3, kept.nbytes());
  }
  EXPECT_EQ(kept.data<char>()[kept.nbytes() - 1], 3);
  kept = Tensor();  // freed, the pool being gone
}

}  // namespace
}  // namespace tessera
