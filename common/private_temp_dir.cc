#include "common/private_temp_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tessera {
namespace {

std::string temp_root() {
  const char* t = std::getenv("TMPDIR");
  std::string root = (t != nullptr && *t != '\0') ? t : "/tmp";
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root;
}

std::string errno_text() { return std::strerror(errno); }

// Empties the folder open as `dirfd` (which this call closes), recursing into sub-folders
// through openat(O_NOFOLLOW): a symlink is an entry like any file and is unlinked itself.
Status empty_folder(int dirfd, const std::string& where) {
  DIR* dir = fdopendir(dirfd);
  if (dir == nullptr) {
    const std::string why = errno_text();
    ::close(dirfd);
    return internal_error("cannot read the folder " + where + ": " + why);
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  Status result = Status::ok();
  for (const std::string& name : names) {
    if (unlinkat(dirfd, name.c_str(), 0) == 0) continue;
    if (errno != EISDIR && errno != EPERM) {
      if (errno != ENOENT) result = internal_error("cannot remove " + where + "/" + name + ": " + errno_text());
      continue;
    }
    const int sub = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      result = internal_error("cannot open " + where + "/" + name + ": " + errno_text());
      continue;
    }
    if (Status st = empty_folder(sub, where + "/" + name); !st.is_ok()) result = st;
    if (unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      result = internal_error("cannot remove " + where + "/" + name + ": " + errno_text());
    }
  }
  closedir(dir);  // closes dirfd
  return result;
}

bool process_exists(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

PrivateTempDir& PrivateTempDir::operator=(PrivateTempDir&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

StatusOr<PrivateTempDir> PrivateTempDir::create(const std::string& prefix) {
  std::string pattern = temp_root() + "/" + prefix + "-" + std::to_string(getpid()) + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return internal_error("cannot create a private temporary folder " + pattern + ": " + errno_text() +
                          " (set TMPDIR to a writable folder)");
  }
  PrivateTempDir d;
  d.path_ = pattern;
  return d;
}

StatusOr<std::string> PrivateTempDir::write_file(const std::string& name, const std::string& content) const {
  if (path_.empty()) return internal_error("write_file on a removed temporary folder");
  const std::string path = path_ + "/" + name;
  TESSERA_RETURN_IF_ERROR(write_new_file(path, content, 0600, "private file"));
  return path;
}

void PrivateTempDir::remove() {
  if (path_.empty()) return;
  (void)remove_tree_nofollow(path_);
  path_.clear();
}

Status write_new_file(const std::string& path, const std::string& content, mode_t mode, const std::string& what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST || errno == ELOOP) {
      return invalid_argument(what + " " + path + ": refusing to write: something (a file or a symlink) is already "
                            "there; remove it or choose another path");
    }
    return internal_error(what + " " + path + ": cannot create: " + errno_text());
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      return internal_error(what + " " + path + ": cannot write: " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return internal_error(what + " " + path + ": cannot write: " + errno_text());
  return Status::ok();
}

Status remove_tree_nofollow(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such folder");
    return internal_error("cannot open the folder " + path + " (a symlink is never followed): " + errno_text());
  }
  Status st = empty_folder(fd, path);
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
    if (st.is_ok()) st = internal_error("cannot remove " + path + ": " + errno_text());
  }
  return st;
}

int remove_stale_private_temp_dirs(const std::string& prefix) {
  const std::string root = temp_root();
  const std::string head = prefix + "-";
  DIR* dir = opendir(root.c_str());
  if (dir == nullptr) return 0;
  std::vector<std::string> stale;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(head, 0) != 0) continue;
    // <prefix>-<pid>-XXXXXX
    const size_t dash = name.find('-', head.size());
    if (dash == std::string::npos || dash == head.size() || name.size() - dash - 1 != 6) continue;
    int64_t pid = 0;
    const char* first = name.data() + head.size();
    auto [end, ec] = std::from_chars(first, name.data() + dash, pid);
    if (ec != std::errc() || end != name.data() + dash || pid <= 0 || pid > INT32_MAX) continue;
    struct stat st {};
    // lstat: a symlink of that name is not a folder of ours, whatever it points at.
    if (fstatat(dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    if (static_cast<pid_t>(pid) == getpid() || process_exists(static_cast<pid_t>(pid))) continue;
    stale.push_back(root + "/" + name);
  }
  closedir(dir);
  int removed = 0;
  for (const std::string& path : stale) {
    if (remove_tree_nofollow(path).is_ok()) ++removed;
  }
  return removed;
}

}  // namespace tessera
