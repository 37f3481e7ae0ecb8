// A real container memory limit (issue: weights beyond a memory budget): a memory cgroup this
// test creates (v2 memory.max, else v1 memory.limit_in_bytes; skipped visibly where neither can
// be made, e.g. without root) limited to half a generated ~100M bf16 model's size. With 25% of
// the weights resident, tessera-generate runs in it and gives the tokens of an unlimited
// all-resident run (its layers from the spill file: the checkpoint is larger than the limit); with
// every weight resident the same command is killed by the limit, so the limit is real.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

bool write_value(const fs::path& file, const std::string& value) {
  std::ofstream f(file);
  f << value;
  f.flush();
  return static_cast<bool>(f);
}

// A memory cgroup of the test's own, removed when it goes (after its processes have ended).
class MemoryCgroup {
 public:
  // nullopt, with *why, where none can be made here.
  static std::optional<MemoryCgroup> make(int64_t limit_bytes, std::string* why) {
    const std::string name = "tessera-memory-test-" + std::to_string(getpid());
    const fs::path v2 = "/sys/fs/cgroup";
    std::error_code ec;
    if (fs::exists(v2 / "cgroup.controllers")) {
      // cgroup v2: the memory controller must be enabled for the root's children.
      (void)write_value(v2 / "cgroup.subtree_control", "+memory");
      const fs::path dir = v2 / name;
      if (fs::create_directory(dir, ec) && fs::exists(dir / "memory.max") &&
          write_value(dir / "memory.max", std::to_string(limit_bytes))) {
        (void)write_value(dir / "memory.swap.max", "0");  // killed, not swapped, past the limit
        return MemoryCgroup(dir);
      }
      fs::remove(dir, ec);
    }
    const fs::path v1 = "/sys/fs/cgroup/memory";
    if (fs::exists(v1 / "memory.limit_in_bytes")) {
      const fs::path dir = v1 / name;
      if (fs::create_directory(dir, ec) && write_value(dir / "memory.limit_in_bytes", std::to_string(limit_bytes))) {
        if (fs::exists(dir / "memory.memsw.limit_in_bytes"))
          (void)write_value(dir / "memory.memsw.limit_in_bytes", std::to_string(limit_bytes));
        (void)write_value(dir / "memory.swappiness", "0");
        return MemoryCgroup(dir);
      }
      fs::remove(dir, ec);
    }
    *why = "no memory cgroup can be created here (cgroup v2 with the memory controller, or v1's memory hierarchy, "
           "writable: run as root)";
    return std::nullopt;
  }
  MemoryCgroup(MemoryCgroup&& o) noexcept : dir_(std::move(o.dir_)) { o.dir_.clear(); }
  ~MemoryCgroup() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove(dir_, ec);  // rmdir: empty once its processes have ended
  }
  // `command` run by /bin/sh inside the cgroup.
  testing::CommandResult run(const std::string& command) const {
    return testing::run_command("sh -c 'echo $$ > " + (dir_ / "cgroup.procs").string() + " && exec " + command + "'");
  }

 private:
  explicit MemoryCgroup(fs::path dir) : dir_(std::move(dir)) {}
  fs::path dir_;
};

TEST(MemoryLimit, HalfTheModelsSizeServesItWithAQuarterResidentAndKillsItWhole) {
  if (testing::kSanitizedBuild) GTEST_SKIP() << "SKIPPED: the sanitizers' own memory is not the model's; the release pass measures it";
  const std::string dir = testing::make_temp_dir("tessera-memory-limit");
  const std::string model = dir + "/llama-100m-bf16";
  const testing::CommandResult made = testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --preset 100m --dtype bfloat16 --out " + model);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const int64_t model_bytes = static_cast<int64_t>(fs::file_size(model + "/model.safetensors"));
  std::string why;
  std::optional<MemoryCgroup> cgroup = MemoryCgroup::make(model_bytes / 2, &why);
  if (!cgroup) GTEST_SKIP() << "SKIPPED: " << why;

  const std::string generate = testing::bin_dir() + "/tessera-generate --model " + model +
                               " --dtype bfloat16 --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 8 --threads 2";
  const testing::CommandResult unlimited = testing::run_command(generate);
  ASSERT_EQ(unlimited.exit_code, 0) << unlimited.err;
  ASSERT_NE(unlimited.out.find('['), std::string::npos) << unlimited.out;

  const testing::CommandResult streamed = cgroup->run("env TESSERA_LOG_LEVEL=info " + generate + " --weights-budget 25%");
  EXPECT_EQ(streamed.exit_code, 0) << "killed by a limit of " << model_bytes / 2 << " bytes: " << streamed.err;
  EXPECT_EQ(streamed.out, unlimited.out) << "the same tokens as every weight resident without a limit";
  EXPECT_NE(streamed.err.find("files are larger than the"), std::string::npos)
      << "with read, a checkpoint larger than the limit streams from the spill file, and the plan says so: " << streamed.err;

  const testing::CommandResult whole = cgroup->run(generate);
  EXPECT_NE(whole.exit_code, 0) << "every weight resident fits in half the model's size: the limit is not real";
}

}  // namespace
}  // namespace tessera
