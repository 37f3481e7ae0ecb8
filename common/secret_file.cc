#include "common/secret_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/input_file.h"

namespace tessera {
namespace {

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

Status check_secret_file_mode(const struct stat& st, uid_t euid, const std::string& what, const std::string& path) {
  const std::string where = what + " " + path + ": ";
  if (!S_ISREG(st.st_mode)) return invalid_argument(where + "not a regular file");
  const mode_t perms = st.st_mode & 0777;
  const std::string mode = "mode " + octal_mode(st.st_mode) + ", owner uid " + std::to_string(st.st_uid);
  if (perms & 0007) {
    return invalid_argument(where + "readable or writable by others (" + mode +
                            "); a secret must be private: chmod 0600 (Kubernetes: the Secret volume's "
                            "defaultMode: 0400)");
  }
  if (st.st_uid == euid) {
    if (perms & 0070) {
      return invalid_argument(where + "has group permissions (" + mode +
                              "); a secret owned by this user must be 0600 or 0400: chmod 0600");
    }
    return Status::ok();
  }
  if (st.st_uid == 0) {
    if (perms & 0030) {
      return invalid_argument(where + "a root-owned secret may be group-readable, not group-writable (" + mode +
                              "): chmod 0640 or 0440");
    }
    return Status::ok();
  }
  return invalid_argument(where + "owned by another user (" + mode + "; this process runs as uid " +
                          std::to_string(euid) + "): a secret must belong to this user or to root");
}

StatusOr<std::string> read_secret_file(const std::string& path, const std::string& what) {
  if (path.empty()) return invalid_argument(what + ": no file given");
  // O_NONBLOCK: a FIFO must not block the open (it is refused below as not a regular file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    return not_found(what + " " + path + ": cannot open: " + std::strerror(errno) + " (is the Secret mounted?)");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return internal_error(what + " " + path + ": cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(what + " " + path + ": is " + describe_non_regular(st.st_mode) + ", not a regular file");
  }
  if (Status s = check_secret_file_mode(st, geteuid(), what, path); !s.is_ok()) {
    ::close(fd);
    return s;
  }
  constexpr size_t kMaxSecretFileBytes = size_t{1} << 20;  // a million keys' worth
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return internal_error(what + " " + path + ": cannot read: " + why);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxSecretFileBytes) {
      ::close(fd);
      return invalid_argument(what + " " + path + ": larger than the 1 MiB limit for a secret file");
    }
  }
  ::close(fd);
  return text;
}

StatusOr<std::vector<std::string>> read_api_keys_file(const std::string& path) {
  const std::string what = "server.http.api_keys_file";
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_secret_file(path, what));
  std::vector<std::string> keys;
  size_t start = 0;
  int line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    const char* blank = " \t\r";
    const size_t b = line.find_first_not_of(blank);
    if (b == std::string::npos || line[b] == '#') continue;
    line = line.substr(b, line.find_last_not_of(blank) - b + 1);
    if (line.find_first_of(" \t") != std::string::npos) {
      return invalid_argument(what + " " + path + ":" + std::to_string(line_no) +
                              ": a key holds a space or tab; one key per line");
    }
    if (line.find('\0') != std::string::npos) {
      return invalid_argument(what + " " + path + ":" + std::to_string(line_no) + ": a key holds a NUL byte");
    }
    keys.push_back(std::move(line));
  }
  if (keys.empty()) {
    return invalid_argument(what + " " + path +
                            ": no keys in the file (only blank or # lines); an empty key file would turn "
                            "authentication off: list one key per line, or drop the setting");
  }
  return keys;
}

}  // namespace tessera
