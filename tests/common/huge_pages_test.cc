// The weights' move onto 2 MiB pages after start (common/huge_pages.h): what a deferral
// records, and that the move puts written windows on huge pages, keeps their contents and
// leaves unwritten ones untouched. Page sizes are read back from /proc/self/smaps.
#include "common/huge_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tensor.h"

namespace tessera {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// kB of anonymous huge pages /proc/self/smaps reports in mappings overlapping [begin, end).
size_t anon_huge_kb(const char* begin, const char* end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  size_t kb = 0;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo < reinterpret_cast<uintptr_t>(end) && hi > reinterpret_cast<uintptr_t>(begin);
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) kb += std::stoul(line.substr(14));
  }
  return kb;
}

size_t resident_pages(const char* begin, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in(bytes / page);
  if (mincore(const_cast<char*>(begin), bytes, in.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

bool transparent_huge_pages_off() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s.empty() || s.find("[never]") != std::string::npos;
}

TEST(HugePagesTest, ADeferralRecordsTheLargeBuffersMadeOnItsThreadWhileItLives) {
  Tensor before = Tensor::zeros({static_cast<int64_t>(4 * kMiB)}, DType::kU8);
  HugePageDeferral outer;
  Tensor large = Tensor::zeros({static_cast<int64_t>(5 * kMiB)}, DType::kU8);
  Tensor small = Tensor::zeros({1024}, DType::kU8);  // the C heap: nothing to move
  std::vector<DeferredRange> inner_ranges;
  {
    HugePageDeferral inner;  // the innermost takes what is made under it
    Tensor nested = Tensor::zeros({static_cast<int64_t>(3 * kMiB)}, DType::kU8);
    inner_ranges = inner.take();
    ASSERT_EQ(inner_ranges.size(), 1u);
    EXPECT_EQ(inner_ranges[0].begin, nested.data<char>());
  }
  EXPECT_TRUE(inner_ranges[0].owner.expired()) << "the range goes with its tensor";
  const std::vector<DeferredRange> ranges = outer.take();
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].begin, large.data<char>());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ranges[0].begin) % kHugePageBytes, 0u);
  // Whole windows of the mapping, covering the tensor.
  EXPECT_EQ(ranges[0].bytes % kHugePageBytes, 0u);
  EXPECT_GE(ranges[0].bytes, 5 * kMiB);
  EXPECT_FALSE(ranges[0].owner.expired());
  EXPECT_TRUE(outer.take().empty()) << "take() forgets what it gave";
}

TEST(HugePagesTest, TheMovePutsWrittenWindowsOnHugePagesKeepsThemAndLeavesUnwrittenOnesAlone) {
  if (transparent_huge_pages_off()) GTEST_SKIP() << "SKIPPED: transparent huge pages are off on this host";
  std::vector<DeferredRange> ranges;
  Tensor t;
  {
    HugePageDeferral deferral;
    t = Tensor::zeros({static_cast<int64_t>(8 * kMiB)}, DType::kU8);
    ranges = deferral.take();
  }
  ASSERT_EQ(ranges.size(), 1u);
  char* p = t.data<char>();
  // Three windows written (the third only in part), the fourth never.
  for (size_t i = 0; i < 5 * kMiB; ++i) p[i] = static_cast<char>(i * 131 + 7);
  EXPECT_EQ(anon_huge_kb(p, p + 8 * kMiB), 0u) << "no advice at first: written on 4 KiB pages";

  const HugePageMoveResult r = move_onto_huge_pages(ranges, nullptr);
  if (!r.collapse_supported) GTEST_SKIP() << "SKIPPED: this kernel cannot collapse pages (" << r.describe() << ")";
  if (r.moved_bytes == 0) GTEST_SKIP() << "SKIPPED: no huge page free on this host (" << r.describe() << ")";
  EXPECT_EQ(r.moved_bytes + r.failed_bytes, 3 * kHugePageBytes) << r.describe();
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(anon_huge_kb(p, p + 8 * kMiB), r.moved_bytes / 1024) << r.describe();
  EXPECT_EQ(resident_pages(p + 6 * kMiB, 2 * kMiB), 0u) << "the unwritten window stays unwritten";
  for (size_t i = 0; i < 5 * kMiB; ++i) {
    ASSERT_EQ(p[i], static_cast<char>(i * 131 + 7)) << "byte " << i;
  }
  for (size_t i = 5 * kMiB; i < 6 * kMiB; ++i) ASSERT_EQ(p[i], 0) << "byte " << i;
}

TEST(HugePagesTest, TheMoveSkipsRangesWhoseTensorsAreGoneAndStopsWhenAsked) {
  std::vector<DeferredRange> ranges;
  {
    HugePageDeferral deferral;
    Tensor gone = Tensor::zeros({static_cast<int64_t>(4 * kMiB)}, DType::kU8);
    gone.data<char>()[0] = 1;
    ranges = deferral.take();
  }
  HugePageMoveResult r = move_onto_huge_pages(ranges, nullptr);
  EXPECT_EQ(r.moved_bytes + r.failed_bytes, 0u) << r.describe();

  Tensor kept;
  {
    HugePageDeferral deferral;
    kept = Tensor::zeros({static_cast<int64_t>(4 * kMiB)}, DType::kU8);
    ranges = deferral.take();
  }
  kept.data<char>()[0] = 1;
  const std::atomic<bool> stop{true};
  r = move_onto_huge_pages(ranges, &stop);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.moved_bytes + r.failed_bytes, 0u) << r.describe();
}

TEST(HugePagesTest, AMoverFinishesOnItsOwnThreadAndCanBeDestroyedAnyTime) {
  Tensor t;
  std::vector<DeferredRange> ranges;
  {
    HugePageDeferral deferral;
    t = Tensor::zeros({static_cast<int64_t>(4 * kMiB)}, DType::kU8);
    ranges = deferral.take();
  }
  std::memset(t.data<char>(), 3, 4 * kMiB);
  {
    HugePageMover early(ranges, "test");  // destroyed at once: stops between windows
  }
  HugePageMover mover(ranges, "test");
  for (int i = 0; i < 2000 && !mover.finished(); ++i) usleep(5000);
  EXPECT_TRUE(mover.finished());
  for (size_t i = 0; i < 4 * kMiB; i += 4096) ASSERT_EQ(t.data<char>()[i], 3);
}

}  // namespace
}  // namespace tessera
