// Secrets on a real tessera-serve with its real worker processes: after start-up with API
// keys configured (inline and through server.http.api_keys_file), no file under the
// process's temp folder and no file the server or its workers hold open contains a key; a
// key file others could read is refused; folders a kill -9 left behind are removed by the
// next start without following the symlinks an attacker could have put there.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::binary) << text;
  ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
}

// Every regular file `pid` has open (its /proc/<pid>/fd targets).
std::vector<std::string> open_files(pid_t pid) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const fs::path target = fs::read_symlink(fd.path(), ec);
    if (ec || target.empty() || target.string()[0] != '/') continue;  // socket:[..], pipe:[..], anon_inode:..
    if (fs::is_regular_file(target, ec)) out.push_back(target.string());
  }
  return out;
}

bool file_contains(const std::string& path, const std::vector<std::string>& needles) {
  const std::string text = testing::read_file(path);
  for (const std::string& n : needles) {
    if (text.find(n) != std::string::npos) return true;
  }
  return false;
}

pid_t a_dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

std::string bearer_get(int port, const std::string& key) {
  return testing::http(port, "GET", "/v1/models", "", "Authorization: Bearer " + key + "\r\n");
}

TEST(ServeSecrets, NoFileUnderTheTempFolderOrOpenByTheServerOrItsWorkersHoldsAnApiKey) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string inline_key = "inline-key-9f3c2a";
  const std::string file_key = "file-key-77d1e0";
  const std::string secrets = testing::make_temp_dir("tessera-secrets");
  const std::string tmp = testing::make_temp_dir("tessera-secrets-tmp");
  const std::string keys_file = secrets + "/api_keys";
  write_text(keys_file, "# the deployment's keys\n\n  " + file_key + "  \n", 0600);
  testing::ServeProcess server;
  server.set_env("TMPDIR", tmp);
  ASSERT_TRUE(server.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=64", "--set", "server.http.api_keys=[" + inline_key + "]", "--set",
                                           "server.http.api_keys_file=" + keys_file})))
      << server.log();
  // Both keys are accepted, nothing else is.
  EXPECT_NE(bearer_get(server.port(), inline_key).find("200 OK"), std::string::npos);
  EXPECT_NE(bearer_get(server.port(), file_key).find("200 OK"), std::string::npos);
  EXPECT_NE(bearer_get(server.port(), "other").find("401"), std::string::npos);

  const std::vector<std::string> keys = {inline_key, file_key};
  // The temp folder: the server's private folder is there, and nothing in it has a key.
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(tmp)) {
    if (!e.is_regular_file()) continue;
    ++files;
    EXPECT_FALSE(file_contains(e.path().string(), keys)) << e.path();
    struct stat st {};
    ASSERT_EQ(lstat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << e.path() << " is readable by others";
  }
  EXPECT_GE(files, 1) << "the workers' configuration should be under TMPDIR " << tmp;
  // Everything the server and its workers hold open.
  std::vector<pid_t> pids = testing::children_of(server.pid());
  ASSERT_FALSE(pids.empty()) << "no worker process";
  pids.push_back(server.pid());
  for (pid_t pid : pids) {
    for (const std::string& path : open_files(pid)) {
      EXPECT_NE(path, keys_file) << "pid " << pid << " keeps the key file open";
      EXPECT_FALSE(file_contains(path, keys)) << "pid " << pid << " has " << path << " open";
    }
    EXPECT_FALSE(file_contains("/proc/" + std::to_string(pid) + "/cmdline", {file_key})) << pid;
  }
  // The log never prints a key.
  EXPECT_FALSE(file_contains(server.dir() + "/serve.log", keys)) << server.log();
  server.stop();
  // A clean exit removes its private folder.
  EXPECT_TRUE(fs::is_empty(tmp)) << tmp;
  fs::remove_all(secrets);
  fs::remove_all(tmp);
}

TEST(ServeSecrets, AKeyFileOthersCanReadIsRefusedNamingItsMode) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string secrets = testing::make_temp_dir("tessera-secrets");
  const std::string keys_file = secrets + "/api_keys";
  write_text(keys_file, "some-key\n", 0644);
  // Through a symlink (as a Kubernetes Secret volume mounts it): the target's mode counts.
  const std::string link = secrets + "/api_keys_link";
  fs::create_symlink(keys_file, link);
  for (const std::string& path : {keys_file, link}) {
    testing::ServeProcess server;
    EXPECT_FALSE(server.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=64", "--set", "server.http.api_keys_file=" + path})));
    const std::string log = server.log();
    EXPECT_NE(log.find("server.http.api_keys_file " + path + ": readable or writable by others (mode 0644"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("chmod 0600"), std::string::npos) << log;
  }
  fs::remove_all(secrets);
}

TEST(ServeSecrets, FoldersOfDeadServersAreRemovedWithoutFollowingSymlinks) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string tmp = testing::make_temp_dir("tessera-secrets-tmp");
  const std::string victim = testing::make_temp_dir("tessera-victim");
  write_text(victim + "/precious", "keep me", 0644);
  const std::string dead = std::to_string(a_dead_pid());
  // A folder a kill -9 left behind, with symlinks into the victim's folder inside it.
  const std::string stale = tmp + "/tessera-serve-" + dead + "-AAAAAA";
  fs::create_directories(stale + "/sub");
  write_text(stale + "/config.yaml", "old", 0600);
  fs::create_symlink(victim + "/precious", stale + "/config-link");
  fs::create_symlink(victim, stale + "/sub/dir-link");
  // A symlink named like such a folder, pointing at the victim's folder: not ours to remove.
  const std::string planted = tmp + "/tessera-serve-" + dead + "-BBBBBB";
  fs::create_symlink(victim, planted);
  // A folder of a process that still runs (this test) stays.
  const std::string alive = tmp + "/tessera-serve-" + std::to_string(getpid()) + "-CCCCCC";
  fs::create_directories(alive);

  testing::ServeProcess server;
  server.set_env("TMPDIR", tmp);
  ASSERT_TRUE(server.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=64"}))) << server.log();
  EXPECT_FALSE(fs::exists(fs::symlink_status(stale))) << stale;
  EXPECT_TRUE(fs::is_symlink(planted)) << planted;
  EXPECT_TRUE(fs::is_directory(alive)) << alive;
  EXPECT_EQ(testing::read_file(victim + "/precious"), "keep me");
  EXPECT_NE(server.log().find("removed 1 temporary folder(s) of tessera-serve processes that no longer run"),
            std::string::npos)
      << server.log();
  // Its own folder: tessera-serve-<its pid>-XXXXXX, 0700, with the 0600 configuration.
  const std::string own_prefix = "tessera-serve-" + std::to_string(server.pid()) + "-";
  int own = 0;
  for (const auto& e : fs::directory_iterator(tmp)) {
    if (e.path().filename().string().rfind(own_prefix, 0) != 0) continue;
    ++own;
    struct stat st {};
    ASSERT_EQ(lstat(e.path().c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(lstat((e.path() / "config.yaml").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  EXPECT_EQ(own, 1);
  fs::remove_all(tmp);  // removes the planted symlink, not the victim
  EXPECT_EQ(testing::read_file(victim + "/precious"), "keep me");
  fs::remove_all(victim);
}

}  // namespace
}  // namespace tessera
