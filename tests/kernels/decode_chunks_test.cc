// How the decode GEMVs cut a weight matrix for threads (kernels/cpu/decode_chunks.h): the
// chunks tile [0, units) in order, edges on the alignment, as many chunks as a multiple of
// the thread count (where there are enough aligned slots), sizes equal to within one
// alignment unit, and about kDecodeChunkBytes each on large matrices.
#include "kernels/cpu/decode_chunks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace tessera::cpu::detail {
namespace {

TEST(DecodeChunks, TileTheMatrixInEqualAlignedChunksPerThread) {
  struct Case {
    int64_t units, unit_bytes, align;
    int threads;
  };
  const Case cases[] = {
      {24, 768 * 32, 1, 2},     // 768 x 768 int8 panels: was 10 + 10 + 4
      {128, 768 * 32, 1, 2},    // 4096 x 768 int8 panels
      {768, 1536, 16, 2},       // 768 x 768 bf16 rows: was 160 x 4 + 128
      {32000, 1536, 16, 2},     // an LM head
      {32000, 1536, 16, 3},     // a thread count that is not a power of two
      {1, 100, 16, 2},          // one row: one chunk
      {17, 4, 16, 8},           // fewer aligned slots than threads
      {50, 1 << 20, 16, 4},     // rows of a MiB: every slot a chunk
      {1000, 0, 16, 2},         // zero-byte rows still tile
  };
  for (const Case& c : cases) {
    std::ostringstream tag;
    tag << c.units << " units of " << c.unit_bytes << " B, align " << c.align << ", " << c.threads << " threads";
    const DecodeChunks chunks(c.units, c.unit_bytes, c.align, c.threads);
    const int64_t slots = (c.units + c.align - 1) / c.align;
    ASSERT_GE(chunks.count(), 1) << tag.str();
    EXPECT_EQ(chunks.begin(0), 0) << tag.str();
    EXPECT_EQ(chunks.begin(chunks.count()), c.units) << tag.str();
    if (slots >= c.threads) {
      EXPECT_EQ(chunks.count() % c.threads, 0) << tag.str() << ": " << chunks.count() << " chunks";
    }
    int64_t smallest = c.units, largest = 0;
    for (int64_t i = 0; i < chunks.count(); ++i) {
      const int64_t b = chunks.begin(i), e = chunks.begin(i + 1);
      ASSERT_LT(b, e) << tag.str() << ": chunk " << i << " is empty";
      EXPECT_EQ(b % c.align, 0) << tag.str() << ": chunk " << i << " starts at " << b;
      // The last chunk ends at `units`, which need not be aligned.
      if (i + 1 < chunks.count()) {
        EXPECT_EQ(e % c.align, 0) << tag.str();
        smallest = std::min(smallest, e - b);
        largest = std::max(largest, e - b);
      }
    }
    if (chunks.count() > 2) {
      EXPECT_LE(largest - smallest, c.align) << tag.str();
    }
    const int64_t bytes = c.units * std::max<int64_t>(1, c.unit_bytes);
    if (bytes >= 8 * kDecodeChunkBytes && slots >= 2 * bytes / kDecodeChunkBytes) {  // room for ~256 KiB chunks
      const double per_chunk = static_cast<double>(bytes) / static_cast<double>(chunks.count());
      EXPECT_GT(per_chunk, 0.5 * kDecodeChunkBytes) << tag.str();
      EXPECT_LT(per_chunk, 1.5 * kDecodeChunkBytes) << tag.str();
    }
  }
}

TEST(DecodeChunks, SmallLayersSplitEvenlyBetweenTwoThreads) {
  // The case that motivated the rule: 24 panels of a 768 x 768 int8 layer.
  const DecodeChunks panels(24, 768 * 32 + 4 * 6 * 32, 1, 2);
  ASSERT_EQ(panels.count(), 2);
  EXPECT_EQ(panels.begin(1), 12);
  const DecodeChunks rows(768, 1536, 16, 2);
  ASSERT_EQ(rows.count() % 2, 0);
  EXPECT_EQ(rows.begin(rows.count() / 2), 384);
}

}  // namespace
}  // namespace tessera::cpu::detail
