// server.http.api_keys_file and the secret-file mode rule (common/secret_file.h), and the
// private temporary folder's refusal to write through anything planted at its paths
// (common/private_temp_dir.h).
#include "common/secret_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/private_temp_dir.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("tessera-secret-file"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  std::string dir_;
};

TEST_F(SecretFileTest, OneKeyPerLineCommentsAndBlankLinesSkippedSpacesTrimmed) {
  const std::string path = write("keys", "# production\n\nkey-one\r\n  key-two\t\n   # old: key-zero\nkey#three\n", 0600);
  auto keys = read_api_keys_file(path);
  ASSERT_TRUE(keys.is_ok()) << keys.status().to_string();
  EXPECT_EQ(*keys, (std::vector<std::string>{"key-one", "key-two", "key#three"}));
}

TEST_F(SecretFileTest, AKeyWithInnerSpaceNamesTheLineNotTheKey) {
  const std::string path = write("keys", "good\nbad key-secret\n", 0600);
  auto keys = read_api_keys_file(path);
  ASSERT_FALSE(keys.is_ok());
  EXPECT_NE(keys.status().message().find(path + ":2: a key holds a space or tab"), std::string::npos)
      << keys.status().message();
  EXPECT_EQ(keys.status().message().find("key-secret"), std::string::npos);
}

TEST_F(SecretFileTest, AFileWithoutKeysIsAnError) {
  auto keys = read_api_keys_file(write("keys", "# nothing yet\n\n", 0600));
  ASSERT_FALSE(keys.is_ok());
  EXPECT_NE(keys.status().message().find("no keys in the file"), std::string::npos) << keys.status().message();
}

TEST_F(SecretFileTest, AMissingFileSaysSo) {
  auto keys = read_api_keys_file(dir_ + "/absent");
  ASSERT_FALSE(keys.is_ok());
  EXPECT_NE(keys.status().message().find("cannot open"), std::string::npos) << keys.status().message();
}

TEST_F(SecretFileTest, GroupOrOtherPermissionsOnOwnFileAreRefused) {
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602}) {
    auto keys = read_api_keys_file(write("keys", "k\n", mode));
    EXPECT_FALSE(keys.is_ok()) << std::oct << mode;
  }
  for (mode_t mode : {0600, 0400}) {
    auto keys = read_api_keys_file(write("keys", "k\n", mode));
    EXPECT_TRUE(keys.is_ok()) << std::oct << mode << " " << keys.status().to_string();
  }
}

TEST_F(SecretFileTest, ASymlinkIsJudgedByItsTarget) {
  // A Kubernetes Secret volume: key -> ..data/key, ..data -> ..2026_01_01_00_00_00.1/.
  fs::create_directories(dir_ + "/..2026_01_01.1");
  const std::string target = write("..2026_01_01.1/api_keys", "k8s-key\n", 0644);
  fs::create_directory_symlink("..2026_01_01.1", dir_ + "/..data");
  fs::create_symlink("..data/api_keys", dir_ + "/api_keys");
  auto keys = read_api_keys_file(dir_ + "/api_keys");
  ASSERT_FALSE(keys.is_ok());
  EXPECT_NE(keys.status().message().find("readable or writable by others (mode 0644"), std::string::npos)
      << keys.status().message();
  ASSERT_EQ(chmod(target.c_str(), 0400), 0);  // defaultMode: 0400
  keys = read_api_keys_file(dir_ + "/api_keys");
  ASSERT_TRUE(keys.is_ok()) << keys.status().to_string();
  EXPECT_EQ(*keys, std::vector<std::string>{"k8s-key"});
}

TEST(SecretFileMode, RootOwnedMayBeGroupReadableOthersNever) {
  struct stat st {};
  st.st_mode = S_IFREG | 0440;  // Kubernetes with fsGroup: root:<fsGroup> 0440
  st.st_uid = 0;
  EXPECT_TRUE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
  st.st_mode = S_IFREG | 0640;
  EXPECT_TRUE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
  st.st_mode = S_IFREG | 0660;
  EXPECT_FALSE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
  st.st_mode = S_IFREG | 0444;
  EXPECT_FALSE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
  // Owned by this user: 0600/0400 only.
  st.st_uid = 10001;
  st.st_mode = S_IFREG | 0440;
  EXPECT_FALSE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
  st.st_mode = S_IFREG | 0400;
  EXPECT_TRUE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
  // Owned by someone else: refused, naming both users.
  st.st_uid = 4242;
  const Status s = check_secret_file_mode(st, 10001, "f", "p");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("owned by another user"), std::string::npos) << s.message();
  // Not a regular file.
  st.st_uid = 10001;
  st.st_mode = S_IFDIR | 0700;
  EXPECT_FALSE(check_secret_file_mode(st, 10001, "f", "p").is_ok());
}

TEST_F(SecretFileTest, PrivateTempDirRefusesWhatIsPlantedAtItsPaths) {
  setenv("TMPDIR", dir_.c_str(), 1);
  auto made = PrivateTempDir::create("tessera-unit");
  unsetenv("TMPDIR");
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  PrivateTempDir tmp = std::move(made).value();
  EXPECT_EQ(fs::path(tmp.path()).parent_path(), fs::path(dir_));
  EXPECT_EQ(fs::status(tmp.path()).permissions(), fs::perms::owner_all);
  auto path = tmp.write_file("config.yaml", "a: 1\n");
  ASSERT_TRUE(path.is_ok()) << path.status().to_string();
  EXPECT_EQ(fs::status(*path).permissions(), fs::perms::owner_read | fs::perms::owner_write);
  // A second write of the same name, and a symlink planted where a file goes, are refused.
  EXPECT_FALSE(tmp.write_file("config.yaml", "b: 2\n").is_ok());
  const std::string victim = write("victim", "untouched", 0644);
  fs::create_symlink(victim, tmp.path() + "/planted");
  const auto refused = tmp.write_file("planted", "overwritten");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("refusing to write"), std::string::npos) << refused.status().message();
  EXPECT_EQ(testing::read_file(victim), "untouched");
  // Removing the folder unlinks the symlink, never its target.
  const std::string where = tmp.path();
  tmp.remove();
  EXPECT_FALSE(fs::exists(fs::symlink_status(where)));
  EXPECT_EQ(testing::read_file(victim), "untouched");
}

TEST_F(SecretFileTest, RemoveTreeNeverFollowsASymlinkedFolder) {
  const std::string victim = dir_ + "/victim";
  fs::create_directories(victim);
  write("victim/file", "x", 0600);
  fs::create_directories(dir_ + "/tree/a");
  fs::create_directory_symlink(victim, dir_ + "/tree/a/link");
  ASSERT_TRUE(remove_tree_nofollow(dir_ + "/tree").is_ok());
  EXPECT_FALSE(fs::exists(dir_ + "/tree"));
  EXPECT_TRUE(fs::exists(victim + "/file"));
  // The top itself as a symlink is refused, not followed.
  fs::create_directory_symlink(victim, dir_ + "/top-link");
  EXPECT_FALSE(remove_tree_nofollow(dir_ + "/top-link").is_ok());
  EXPECT_TRUE(fs::exists(victim + "/file"));
}

}  // namespace
}  // namespace tessera
