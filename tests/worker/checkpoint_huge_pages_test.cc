// Layers streamed from a checkpoint just written (worker/checkpoint_huge_pages.h): a real
// safetensors file written in 4 KiB pieces, as a conversion or a copy writes, whose page cache
// then maps on small pages; after map_on_huge_pages each range maps on 2 MiB pages (read from
// /proc/self/smaps here, apart from the function's own report) and is left unmapped. Skipped
// visibly where this kernel and filesystem give a file no 2 MiB pages even read from the disk
// through a mapping that asks for them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/safetensors_writer.h"
#include "tests/test_support.h"
#include "worker/checkpoint_huge_pages.h"

namespace tessera {
namespace checkpoint_huge_pages_test {

constexpr size_t kHuge = size_t{2} << 20;

// The whole 2 MiB pages of [data, data + bytes).
std::pair<char*, size_t> interior(const void* data, size_t bytes) {
  const auto from = reinterpret_cast<uintptr_t>(data), to = from + bytes;
  const uintptr_t first = (from + kHuge - 1) & ~(kHuge - 1), last = to & ~(kHuge - 1);
  return {reinterpret_cast<char*>(first), last > first ? last - first : 0};
}

// The share of `range` mapped on 2 MiB pages once mapped afresh; unmapped again after.
double huge_share(std::pair<char*, size_t> range) {
  ::madvise(range.first, range.second, MADV_DONTNEED);
  if (::madvise(range.first, range.second, MADV_POPULATE_READ) != 0) return -1;
  const int64_t pmd = file_pmd_mapped_bytes(range.first);
  ::madvise(range.first, range.second, MADV_DONTNEED);
  return pmd < 0 ? -1 : static_cast<double>(pmd) / static_cast<double>(range.second);
}

// Whether a file read from the disk through a mapping that asks for huge pages gets them here.
bool files_map_on_huge_pages(const std::string& dir, std::string* why_not) {
  if (!file_huge_pages_allowed(why_not)) return false;
  const std::string path = dir + "/probe";
  testing::write_file(path, std::string(3 * kHuge, 'p'));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* p = ::mmap(nullptr, 3 * kHuge, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return false;
  const auto range = interior(p, 3 * kHuge);
  ::madvise(range.first, range.second, MADV_HUGEPAGE);
  const double share = range.second > 0 ? huge_share(range) : 0;
  ::munmap(p, 3 * kHuge);
  if (share >= 0.9) return true;
  *why_not = "a file read from the disk here maps on small pages (this filesystem or kernel keeps no 2 MiB folios)";
  return false;
}

TEST(CheckpointHugePages, RangesOfAFileJustWrittenAreReadAgainOntoHugePagesAndLeftUnmapped) {
  const std::string dir = testing::make_temp_dir("tessera-huge-pages");
  std::string why_not;
  if (!files_map_on_huge_pages(dir, &why_not)) GTEST_SKIP() << "SKIPPED: " << why_not;

  // Two 8 MiB matrices, written 4 KiB at a time (stdio writes in pieces of that size too).
  const std::string path = dir + "/model.safetensors";
  auto writer = SafetensorsWriter::create(path, {{"a", DType::kF32, {1024, 2048}}, {"b", DType::kF32, {1024, 2048}}});
  ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
  const std::vector<char> piece(4096, 1);
  for (size_t written = 0; written < 2 * 1024 * 2048 * sizeof(float); written += piece.size())
    ASSERT_TRUE(writer.value()->append(piece.data(), piece.size()).is_ok());
  ASSERT_TRUE(writer.value()->finish().is_ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const char* base = file.value()->whole_mapping().base;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const TensorInfo& t : file.value()->tensors())
    ranges.emplace_back(static_cast<const char*>(t.data) - base, t.nbytes);

  const HugePageCheck check = map_on_huge_pages(*file.value(), ranges);
  std::cout << "[ REPORT   ] " << check.read_again << " of " << check.ranges << " ranges read again\n";
  EXPECT_EQ(check.ranges, 2);
  EXPECT_EQ(check.still_small, 0) << check.describe(path);
  for (const auto& [offset, bytes] : ranges) {
    const auto range = interior(base + offset, bytes);
    ASSERT_GT(range.second, 0u);
    // Left unmapped: nothing of it is in the process until a step maps it.
    const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<uint64_t> entries(range.second / 4096);
    ASSERT_EQ(::pread(fd, entries.data(), entries.size() * 8,
                      static_cast<off_t>(reinterpret_cast<uintptr_t>(range.first) / 4096 * 8)),
              static_cast<ssize_t>(entries.size() * 8));
    ::close(fd);
    size_t present = 0;
    for (uint64_t e : entries) present += e >> 63;
    EXPECT_EQ(present, 0u) << "pages of a range still mapped after the check";
    EXPECT_GE(huge_share(range), 0.9) << "tensor at " << offset << ": " << check.describe(path);
  }
  // Where the file had been cached on small pages the start-up log says what was read again.
  if (check.read_again > 0) {
    EXPECT_NE(check.describe(path).find("read them again from the disk onto 2 MiB pages"), std::string::npos);
  }
}

TEST(CheckpointHugePages, SmallRangesAreLeftAlone) {
  const std::string dir = testing::make_temp_dir("tessera-huge-pages-small");
  testing::write_file(dir + "/config.json", "{}");
  auto writer = SafetensorsWriter::create(dir + "/model.safetensors", {{"w", DType::kF32, {256, 256}}});
  ASSERT_TRUE(writer.is_ok());
  const std::vector<float> data(256 * 256, 1.0f);
  ASSERT_TRUE(writer.value()->write("w", data.data(), data.size() * sizeof(float)).is_ok());
  ASSERT_TRUE(writer.value()->finish().is_ok());
  auto file = SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(file.is_ok());
  const TensorInfo& t = file.value()->tensors().front();
  // 256 KiB holds no whole 2 MiB page: nothing to map or read again.
  const HugePageCheck check = map_on_huge_pages(
      *file.value(), {{static_cast<const char*>(t.data) - file.value()->whole_mapping().base, t.nbytes}});
  EXPECT_EQ(check.ranges, 0);
  EXPECT_EQ(check.read_again, 0);
  EXPECT_EQ(check.describe(dir), "");
}

}  // namespace checkpoint_huge_pages_test
}  // namespace tessera
