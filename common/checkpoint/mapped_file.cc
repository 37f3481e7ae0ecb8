#include "common/checkpoint/mapped_file.h"

#include "common/input_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera {

StatusOr<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block the open
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + ": no such file");
    return invalid_argument(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = std::strerror(errno);
    ::close(fd);
    return invalid_argument(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": is " + describe_non_regular(st.st_mode) + ", not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return data_loss(path + ": empty file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string err = std::strerror(errno);
  ::close(fd);  // the mapping keeps the file open
  if (base == MAP_FAILED) return internal_error(path + ": mmap failed: " + err);
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->base_ = base;
  file->size_ = size;
  return file;
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

}  // namespace tessera
