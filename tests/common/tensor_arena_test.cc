// TensorArena: small tensors are carved from shared zeroed chunks, 64-byte aligned and
// disjoint; a tensor as large as a chunk gets its own; a chunk outlives the arena while any
// tensor carved from it lives.
#include "common/tensor_arena.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(TensorArena, CarvesAlignedDisjointZeroedTensorsFromChunks) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<Tensor> kept;
  {
    TensorArena arena(kChunk);
    const char* lo = nullptr;
    const char* hi = nullptr;
    for (int i = 0; i < 10; ++i) {
      Tensor t = arena.zeros({3 + i, 1000}, DType::kBF16);  // 6,000-24,000 bytes, not multiples of 64
      ASSERT_EQ(reinterpret_cast<uintptr_t>(t.data<char>()) % 64, 0u);
      for (size_t b = 0; b < t.nbytes(); ++b) ASSERT_EQ(t.data<char>()[b], 0);
      std::memset(t.data<char>(), i + 1, t.nbytes());
      if (i == 0) lo = t.data<char>();
      hi = t.data<char>() + t.nbytes();
      kept.push_back(std::move(t));
    }
    EXPECT_LT(static_cast<size_t>(hi - lo), kChunk) << "all ten from one chunk";
    // Filling one never wrote into another.
    for (int i = 0; i < 10; ++i)
      for (size_t b = 0; b < kept[static_cast<size_t>(i)].nbytes(); ++b)
        ASSERT_EQ(kept[static_cast<size_t>(i)].data<char>()[b], i + 1) << "tensor " << i << " byte " << b;
    // A tensor the size of a chunk comes on its own, outside the current chunk.
    // (Addresses compared as integers: the tensors may live in different mappings.)
    const auto at = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data<char>()); };
    const uintptr_t chunk = reinterpret_cast<uintptr_t>(lo);
    Tensor big = arena.zeros({static_cast<int64_t>(kChunk)}, DType::kI8);
    EXPECT_TRUE(at(big) + big.nbytes() <= chunk || at(big) >= chunk + kChunk);
    // What no longer fits the chunk starts a new one.
    Tensor a = arena.zeros({static_cast<int64_t>(kChunk / 2)}, DType::kI8);
    Tensor b = arena.zeros({static_cast<int64_t>(kChunk / 2) + 64}, DType::kI8);
    EXPECT_TRUE(at(b) + b.nbytes() <= at(a) || at(b) >= at(a) + a.nbytes());
    EXPECT_TRUE(at(b) + b.nbytes() <= chunk || at(b) >= chunk + kChunk);
  }
  // The arena is gone; its chunks live on with the tensors.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(kept[static_cast<size_t>(i)].data<char>()[0], i + 1);
}

}  // namespace
}  // namespace tessera
