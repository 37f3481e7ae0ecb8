#pragma once
// A whole file mapped read-only (MAP_PRIVATE, PROT_READ): opening costs nothing but the
// mapping, and pages are read from disk only when touched, so a tensor-parallel rank that
// reads only its slices only ever has those pages resident.
#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace tessera {

class MappedFile {
 public:
  // Errors name the file: missing, not a regular file, unreadable, or empty.
  static StatusOr<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const char* data() const { return static_cast<const char*>(base_); }
  size_t size() const { return size_; }

 private:
  MappedFile() = default;
  std::string path_;
  void* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tessera
