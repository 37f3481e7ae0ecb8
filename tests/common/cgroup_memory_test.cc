// cgroup_memory (common/cgroup_memory.h) on cgroup file systems laid out in a temporary
// folder as the kernel lays them out: v1's memory hierarchy, v2's unified one.
#include "common/cgroup_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

void put(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  testing::write_file(file.string(), text + "\n");
}

TEST(CgroupMemory, V1TheTightestLimitOnTheWayUpLessWhatIsHeldAndWouldNotBeDropped) {
  const fs::path root = testing::make_temp_dir("tessera-cgroup-v1");
  put(root / "memory/memory.limit_in_bytes", "9223372036854771712");  // the root: no limit
  put(root / "memory/memory.usage_in_bytes", "900000000");
  put(root / "memory/grp/memory.limit_in_bytes", "1000000");
  put(root / "memory/grp/memory.usage_in_bytes", "600000");
  put(root / "memory/grp/memory.stat", "cache 200000\ntotal_inactive_file 100000\ntotal_active_file 50000\ntotal_rss 400000");
  put(root / "memory/grp/sub/memory.limit_in_bytes", "9223372036854771712");
  put(root / "memory/grp/sub/memory.usage_in_bytes", "300000");
  const auto m = cgroup_memory("5:devices:/\n4:memory:/grp/sub\n0::/\n", root.string());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->limit_bytes, 1000000);
  EXPECT_EQ(m->available_bytes, 1000000 - (600000 - 150000));
}

TEST(CgroupMemory, V2MemoryMaxAndCurrent) {
  const fs::path root = testing::make_temp_dir("tessera-cgroup-v2");
  put(root / "a/memory.max", "2000000");
  put(root / "a/memory.current", "500000");
  put(root / "a/memory.stat", "anon 400000\ninactive_file 50000\nactive_file 30000\nshmem 20000");
  put(root / "a/b/memory.max", "max");
  put(root / "a/b/memory.current", "100000");
  const auto m = cgroup_memory("0::/a/b\n", root.string());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->limit_bytes, 2000000);
  EXPECT_EQ(m->available_bytes, 2000000 - 420000);  // shared memory stays held
}

TEST(CgroupMemory, NoLimitOrNothingReadableIsNone) {
  const fs::path root = testing::make_temp_dir("tessera-cgroup-none");
  put(root / "memory.max", "max");
  put(root / "memory.current", "100");
  EXPECT_FALSE(cgroup_memory("0::/\n", root.string()).has_value());
  EXPECT_FALSE(cgroup_memory("0::/not/there\n", root.string()).has_value());
  EXPECT_FALSE(cgroup_memory("garbage", root.string()).has_value());
  put(root / "odd/memory.max", "12abc");
  put(root / "odd/memory.current", "1");
  EXPECT_FALSE(cgroup_memory("0::/odd\n", root.string()).has_value()) << "a value that is not a number";
}

}  // namespace
}  // namespace tessera
