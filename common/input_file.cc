#include "common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

Status open_error(const std::string& path, const std::string& what, int err) {
  const std::string head = path + ": " + what + ": ";
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return not_found(head + "no such file");
    case ELOOP:
      return invalid_argument(head + "symbolic link loop (too many levels of symbolic links)");
    case EACCES:
    case EPERM:
      return invalid_argument(head + "permission denied");
    default:
      return invalid_argument(head + "cannot open (" + std::strerror(err) + ")");
  }
}

// Closes the descriptor on every path out of read_input_file.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string describe_non_regular(unsigned mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

namespace {

// Reads a regular file; past `max_bytes` an error, or (head_only) just its first max_bytes.
StatusOr<std::string> read_regular(const std::string& path, const std::string& what, size_t max_bytes,
                                   bool head_only) {
  if (path.empty()) return invalid_argument(what + ": no file named (an empty path)");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the
  // fstat below refuses it before any read.
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) return open_error(path, what, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return data_loss(path + ": " + what + ": cannot stat (" + std::strerror(errno) + ")");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument(path + ": " + what + ": is " + describe_non_regular(st.st_mode) + ", not a regular file");
  }
  auto too_large = [&] {
    return invalid_argument(path + ": " + what + ": larger than the " + std::to_string(max_bytes >> 20) +
                            " MiB limit for this file (" + std::to_string(static_cast<long long>(st.st_size)) +
                            " bytes)");
  };
  if (!head_only && static_cast<unsigned long long>(st.st_size) > max_bytes) return too_large();
  std::string out;
  out.reserve(std::min(static_cast<size_t>(st.st_size), max_bytes));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return data_loss(path + ": " + what + ": read error (" + std::strerror(errno) + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      if (!head_only) return too_large();  // it grew while being read
      out.resize(max_bytes);
      break;
    }
  }
  return out;
}

}  // namespace

StatusOr<std::string> read_input_file(const std::string& path, const std::string& what, size_t max_bytes) {
  return read_regular(path, what, max_bytes, false);
}

StatusOr<std::string> read_input_file_head(const std::string& path, const std::string& what, size_t max_bytes) {
  return read_regular(path, what, max_bytes, true);
}

StatusOr<bool> input_path_exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  const int err = errno;
  if (err == ENOENT) return false;
  if (err == ENOTDIR) return false;  // a component is a file: nothing can be below it
  if (err == ELOOP) return invalid_argument(path + ": symbolic link loop (too many levels of symbolic links)");
  return invalid_argument(path + ": cannot look it up (" + std::string(std::strerror(err)) + ")");
}

StatusOr<nlohmann::json> read_input_json(const std::string& path, const std::string& what) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_input_file(path, what));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument(path + ": " + what + " is not valid JSON: " + e.what());
  }
}

}  // namespace tessera
