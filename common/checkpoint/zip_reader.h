#pragma once
// The member table of a zip archive held in memory (PyTorch's zip checkpoints: torch.save
// since 1.6 writes `<name>/data.pkl` plus one `<name>/data/<key>` member per storage, all
// stored uncompressed and 64-byte aligned). Reads the end-of-central-directory record
// (zip64 when the archive needs it), the central directory and each member's local header,
// and checks that every member's bytes lie inside the archive. A compressed or encrypted
// member is refused: its bytes could not be mapped in place.
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace tessera {

struct ZipMember {
  std::string name;
  uint64_t data_offset = 0;  // of the member's first byte, from the archive's start
  uint64_t size = 0;
};

class ZipReader {
 public:
  // `where` names the archive in errors (its path).
  static StatusOr<ZipReader> parse(const char* data, size_t size, const std::string& where);

  const std::vector<ZipMember>& members() const { return members_; }
  const ZipMember* find(const std::string& name) const;  // nullptr when absent

 private:
  std::vector<ZipMember> members_;
  std::unordered_map<std::string, size_t> by_name_;
};

// Whether `data` starts like a zip archive (a local file header signature).
bool looks_like_zip(const char* data, size_t size);

}  // namespace tessera
