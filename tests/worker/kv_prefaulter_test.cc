// KvPrefaulter: the CPU KV pool's pages are faulted in ahead of the blocks in use, without
// touching their contents, and no further than the margin ahead.
#include "worker/kv_prefaulter.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tessera {
namespace {

// A lazily mapped region on base pages (no huge-page advice, so residency is per 4 KiB page).
struct Mapping {
  explicit Mapping(size_t n) : bytes(n) {
    base = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    madvise(base, n, MADV_NOHUGEPAGE);
  }
  ~Mapping() { munmap(base, bytes); }
  // Whether each page of [begin, end) is resident.
  std::vector<bool> resident(size_t begin, size_t end) const {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v((end - begin) / page);
    EXPECT_EQ(mincore(base + begin, end - begin, v.data()), 0);
    std::vector<bool> out;
    for (unsigned char c : v) out.push_back((c & 1) != 0);
    return out;
  }
  char* base = nullptr;
  size_t bytes;
};

bool kernel_can_populate() {
  Mapping probe(size_t{1} << 16);
  return madvise(probe.base, probe.bytes, MADV_POPULATE_WRITE) == 0;
}

bool wait_for_populated(const KvPrefaulter& p, int blocks) {
  for (int i = 0; i < 500 && p.populated_blocks() < blocks; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return p.populated_blocks() >= blocks;
}

TEST(KvPrefaulter, FaultsInTheBlocksAheadOfUseAndNoFurther) {
  if (!kernel_can_populate()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)";
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  constexpr int kBlocks = 4096;
  const size_t block_bytes = 2 * page;  // 2 MiB is 256 blocks ahead at 4 KiB pages
  Mapping k(kBlocks * block_bytes), v(kBlocks * block_bytes);
  // A step already wrote block 0 of K: its contents must survive the prefault.
  std::memset(k.base, 0x5a, block_bytes);
  KvPrefaulter p({{k.base, block_bytes}, {v.base, block_bytes}}, kBlocks);
  const int ahead = p.ahead_blocks();
  EXPECT_EQ(ahead, static_cast<int>((size_t{2} << 20) / block_bytes));
  // Before any step, the first step's blocks (the lowest), and no more.
  ASSERT_TRUE(wait_for_populated(p, ahead));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(p.populated_blocks(), ahead);
  for (const Mapping* m : {&k, &v}) {
    const std::vector<bool> beyond = m->resident((ahead + 16) * block_bytes, kBlocks * block_bytes);
    EXPECT_EQ(std::count(beyond.begin(), beyond.end(), true), 0) << "nothing far beyond the first step's blocks";
  }

  p.in_use_below(10);
  ASSERT_TRUE(wait_for_populated(p, 10 + ahead));
  EXPECT_EQ(p.populated_blocks(), 10 + ahead);
  for (const Mapping* m : {&k, &v}) {
    const std::vector<bool> done = m->resident(0, (10 + ahead) * block_bytes);
    EXPECT_EQ(std::count(done.begin(), done.end(), false), 0) << "every page up to the margin is resident";
    const std::vector<bool> beyond = m->resident((10 + ahead + 16) * block_bytes, kBlocks * block_bytes);
    EXPECT_EQ(std::count(beyond.begin(), beyond.end(), true), 0) << "nothing far beyond it";
  }
  for (size_t i = 0; i < block_bytes; ++i) ASSERT_EQ(static_cast<unsigned char>(k.base[i]), 0x5a) << "byte " << i;

  // Blocks in use only grow the target; past the pool's end it stops at the end.
  p.in_use_below(5);
  p.in_use_below(kBlocks + 100);
  ASSERT_TRUE(wait_for_populated(p, kBlocks));
  EXPECT_EQ(p.populated_blocks(), kBlocks);
}

}  // namespace
}  // namespace tessera
