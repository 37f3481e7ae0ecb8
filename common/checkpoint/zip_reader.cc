#include "common/checkpoint/zip_reader.h"

#include <algorithm>

namespace tessera {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kMaxComment = 0xffff;

// Little-endian reads; callers have checked the bounds.
uint64_t le(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

bool looks_like_zip(const char* data, size_t size) { return size >= 4 && le(data, 4) == kLocalHeaderSig; }

const ZipMember* ZipReader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &members_[it->second];
}

StatusOr<ZipReader> ZipReader::parse(const char* data, size_t size, const std::string& where) {
  auto truncated = [&](const std::string& what) {
    return data_loss(where + ": truncated or corrupt zip archive: " + what);
  };
  // The end record sits in the last 22 + comment bytes; search backwards for its signature.
  if (size < kEndSize) return truncated("shorter than an end-of-central-directory record");
  size_t end_at = SIZE_MAX;
  const size_t lowest = size - kEndSize > kMaxComment ? size - kEndSize - kMaxComment : 0;
  for (size_t i = size - kEndSize + 1; i-- > lowest;) {
    if (le(data + i, 4) == kEndSig && i + kEndSize + le(data + i + 20, 2) == size) {
      end_at = i;
      break;
    }
  }
  if (end_at == SIZE_MAX) return truncated("no end-of-central-directory record (the file was cut short?)");
  const char* end = data + end_at;
  uint64_t entries = le(end + 10, 2);
  uint64_t cd_size = le(end + 12, 4);
  uint64_t cd_offset = le(end + 16, 4);
  if (le(end + 4, 2) != 0 || le(end + 6, 2) != 0) return invalid_argument(where + ": multi-disk zip archives are not supported");

  // Zip64: the 16/32-bit fields saturate and the real values live in the zip64 end record.
  if (entries == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
    if (end_at < kZip64LocatorSize || le(end - kZip64LocatorSize, 4) != kZip64LocatorSig)
      return truncated("a saturated end record without a zip64 locator");
    uint64_t z64_at = le(end - kZip64LocatorSize + 8, 8);
    if (z64_at > end_at - kZip64LocatorSize || end_at - kZip64LocatorSize - z64_at < kZip64EndSize ||
        le(data + z64_at, 4) != kZip64EndSig)
      return truncated("the zip64 locator points outside the archive");
    const char* z = data + z64_at;
    entries = le(z + 32, 8);
    cd_size = le(z + 40, 8);
    cd_offset = le(z + 48, 8);
  }
  if (cd_offset > size || cd_size > size - cd_offset) return truncated("the central directory lies outside the file");
  // Each entry takes at least 46 bytes, which bounds a lying count before anything is reserved.
  if (entries > cd_size / kCentralHeaderSize) return truncated("more entries than the central directory can hold");

  ZipReader zip;
  zip.members_.reserve(entries);
  const char* p = data + cd_offset;
  const char* cd_end = p + cd_size;
  for (uint64_t e = 0; e < entries; ++e) {
    if (cd_end - p < static_cast<ptrdiff_t>(kCentralHeaderSize) || le(p, 4) != kCentralHeaderSig)
      return truncated("central directory entry " + std::to_string(e) + " is damaged");
    const uint64_t flags = le(p + 8, 2);
    const uint64_t method = le(p + 10, 2);
    uint64_t comp_size = le(p + 20, 4);
    uint64_t size32 = le(p + 24, 4);
    const uint64_t name_len = le(p + 28, 2);
    const uint64_t extra_len = le(p + 30, 2);
    const uint64_t comment_len = le(p + 32, 2);
    uint64_t local_at = le(p + 42, 4);
    if (static_cast<uint64_t>(cd_end - p) < kCentralHeaderSize + name_len + extra_len + comment_len)
      return truncated("central directory entry " + std::to_string(e) + " runs past the directory");
    ZipMember m;
    m.name.assign(p + kCentralHeaderSize, name_len);
    // The zip64 extra field holds, in this order, those of the three that saturated.
    const char* x = p + kCentralHeaderSize + name_len;
    const char* x_end = x + extra_len;
    while (x_end - x >= 4) {
      const uint64_t id = le(x, 2), len = le(x + 2, 2);
      if (static_cast<uint64_t>(x_end - x - 4) < len) return truncated("member " + m.name + " has a damaged extra field");
      if (id == 0x0001) {
        const char* f = x + 4;
        const char* f_end = f + len;
        auto take = [&](uint64_t* v) {
          if (*v != 0xffffffff) return true;
          if (f_end - f < 8) return false;
          *v = le(f, 8);
          f += 8;
          return true;
        };
        if (!take(&size32) || !take(&comp_size) || !take(&local_at))
          return truncated("member " + m.name + " has a short zip64 extra field");
      }
      x += 4 + len;
    }
    if (flags & 1) return invalid_argument(where + ": member " + m.name + " is encrypted");
    if (method != 0) {
      return invalid_argument(where + ": member " + m.name + " is compressed (method " + std::to_string(method) +
                              "); only stored (uncompressed) members can be mapped, as torch.save writes them");
    }
    if (comp_size != size32)
      return truncated("stored member " + m.name + " has different compressed and uncompressed sizes");
    // The data starts after the local header, whose extra field (PyTorch's alignment padding)
    // may differ in length from the central directory's.
    if (local_at > size || size - local_at < kLocalHeaderSize || le(data + local_at, 4) != kLocalHeaderSig)
      return truncated("member " + m.name + "'s local header lies outside the file");
    const uint64_t data_at = local_at + kLocalHeaderSize + le(data + local_at + 26, 2) + le(data + local_at + 28, 2);
    if (data_at > size || size32 > size - data_at)
      return truncated("member " + m.name + " (" + std::to_string(size32) + " bytes) runs past the end of the file");
    m.data_offset = data_at;
    m.size = size32;
    if (!zip.by_name_.emplace(m.name, zip.members_.size()).second)
      return invalid_argument(where + ": member " + m.name + " appears twice in the zip archive");
    zip.members_.push_back(std::move(m));
    p += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
  return zip;
}

}  // namespace tessera
