#include "common/checkpoint/torch_writer.h"

#include <array>
#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

constexpr const char* kArchive = "archive/";

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void put_le(std::string* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) *out += static_cast<char>((v >> (8 * i)) & 0xff);
}

const char* storage_class(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "FloatStorage";
    case DType::kF16: return "HalfStorage";
    case DType::kBF16: return "BFloat16Storage";
    case DType::kI32: return "IntStorage";
    case DType::kI64: return "LongStorage";
    case DType::kU8: return "ByteStorage";
    case DType::kI8: return "CharStorage";
  }
  return "FloatStorage";
}

// Protocol-2 pickle of an OrderedDict name -> _rebuild_tensor_v2(storage k, 0, shape,
// row-major strides, False, OrderedDict()), storage k = ('storage', torch.XStorage, "k",
// 'cpu', numel), as torch.save writes one.
class StateDictPickle {
 public:
  std::string build(const std::vector<TorchZipWriter::Entry>& entries) {
    raw("\x80\x02");
    global("collections", "OrderedDict");
    raw(")R(");
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      str(e.name);
      global("torch._utils", "_rebuild_tensor_v2");
      raw("((");
      str("storage");
      global("torch", storage_class(e.dtype));
      str(std::to_string(i));
      str("cpu");
      integer(numel);
      raw("tQ");
      integer(0);
      raw("(");
      for (int64_t d : e.shape) integer(d);
      raw("t(");
      int64_t stride = numel;
      for (int64_t d : e.shape) {
        stride = d == 0 ? stride : stride / d;
        integer(stride);
      }
      raw("t\x89");
      global("collections", "OrderedDict");
      raw(")RtR");
    }
    raw("u.");
    return out_;
  }

 private:
  void raw(const char* s) { out_ += s; }
  void str(const std::string& s) {
    out_ += 'X';
    put_le(&out_, s.size(), 4);
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v <= INT32_MAX) {
      out_ += 'J';
      put_le(&out_, static_cast<uint64_t>(v), 4);
    } else {
      out_ += "\x8a\x08";
      put_le(&out_, static_cast<uint64_t>(v), 8);
    }
  }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  std::string out_;
};

}  // namespace

StatusOr<std::unique_ptr<TorchZipWriter>> TorchZipWriter::create(const std::string& path, std::vector<Entry> entries) {
  std::unique_ptr<TorchZipWriter> w(new TorchZipWriter());
  w->path_ = path;
  w->file_ = std::fopen(path.c_str(), "wb");
  if (w->file_ == nullptr) return invalid_argument(path + ": cannot create: " + std::strerror(errno));
  for (const auto& e : entries) {
    uint64_t n = dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      if (d < 0) return invalid_argument(path + ": tensor '" + e.name + "' has a negative dimension");
      n *= static_cast<uint64_t>(d);
    }
    w->sizes_.push_back(n);
  }
  w->entries_ = std::move(entries);
  TESSERA_RETURN_IF_ERROR(w->write_member(std::string(kArchive) + "data.pkl", StateDictPickle().build(w->entries_)));
  TESSERA_RETURN_IF_ERROR(w->write_member(std::string(kArchive) + "byteorder", "little"));
  return w;
}

TorchZipWriter::~TorchZipWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status TorchZipWriter::write_raw(const void* data, size_t n) {
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) return internal_error(path_ + ": write failed: " + std::strerror(errno));
  offset_ += n;
  return Status::ok();
}

// A local header with zero CRC (patched by end_member) and the known size; the "FB" extra
// field pads the data start to 64 bytes, as torch does, so storages can be mapped aligned.
// A member of 4 GiB or more carries its sizes in a zip64 extra field.
Status TorchZipWriter::begin_member(const std::string& name, uint64_t size) {
  const bool big = size >= 0xffffffffu;
  const size_t z64 = big ? 20 : 0;
  const size_t pad = (64 - (offset_ + 30 + name.size() + z64 + 4) % 64) % 64;
  std::string h;
  put_le(&h, 0x04034b50, 4);
  put_le(&h, big ? 45 : 20, 2);
  put_le(&h, 0, 2);  // flags
  put_le(&h, 0, 2);  // stored
  put_le(&h, 0, 4);  // time, date
  put_le(&h, 0, 4);  // CRC-32, patched
  put_le(&h, big ? 0xffffffffu : size, 4);
  put_le(&h, big ? 0xffffffffu : size, 4);
  put_le(&h, name.size(), 2);
  put_le(&h, z64 + 4 + pad, 2);
  h += name;
  if (big) {
    put_le(&h, 1, 2);
    put_le(&h, 16, 2);
    put_le(&h, size, 8);
    put_le(&h, size, 8);
  }
  put_le(&h, 0x4246, 2);
  put_le(&h, pad, 2);
  h.append(pad, 'Z');
  members_.push_back({name, offset_, size, 0});
  return write_raw(h.data(), h.size());
}

Status TorchZipWriter::end_member() {
  const Member& m = members_.back();
  const long at = static_cast<long>(m.local_at + 14);
  unsigned char crc[4];
  for (int i = 0; i < 4; ++i) crc[i] = static_cast<unsigned char>(m.crc >> (8 * i));
  if (std::fseek(file_, at, SEEK_SET) != 0 || std::fwrite(crc, 1, 4, file_) != 4 || std::fseek(file_, 0, SEEK_END) != 0)
    return internal_error(path_ + ": write failed: " + std::strerror(errno));
  return Status::ok();
}

Status TorchZipWriter::write_member(const std::string& name, const std::string& bytes) {
  TESSERA_RETURN_IF_ERROR(begin_member(name, bytes.size()));
  members_.back().crc = crc32_update(0, bytes.data(), bytes.size());
  TESSERA_RETURN_IF_ERROR(write_raw(bytes.data(), bytes.size()));
  return end_member();
}

Status TorchZipWriter::append(const void* data, size_t nbytes) {
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    if (!open_) {
      if (cursor_ >= entries_.size()) return invalid_argument(path_ + ": more data appended than the tensors declare");
      TESSERA_RETURN_IF_ERROR(begin_member(std::string(kArchive) + "data/" + std::to_string(cursor_), sizes_[cursor_]));
      member_left_ = sizes_[cursor_];
      ++cursor_;
      open_ = true;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(nbytes, member_left_));
    members_.back().crc = crc32_update(members_.back().crc, p, n);
    TESSERA_RETURN_IF_ERROR(write_raw(p, n));
    p += n;
    nbytes -= n;
    member_left_ -= n;
    if (member_left_ == 0) {
      TESSERA_RETURN_IF_ERROR(end_member());
      open_ = false;
    }
  }
  return Status::ok();
}

Status TorchZipWriter::finish() {
  if (finished_) return Status::ok();
  // Empty tensors have storages too.
  while (!open_ && cursor_ < entries_.size() && sizes_[cursor_] == 0) {
    TESSERA_RETURN_IF_ERROR(begin_member(std::string(kArchive) + "data/" + std::to_string(cursor_), 0));
    TESSERA_RETURN_IF_ERROR(end_member());
    ++cursor_;
  }
  if (open_ || cursor_ < entries_.size()) return internal_error(path_ + ": finished before every tensor's data was written");
  TESSERA_RETURN_IF_ERROR(write_member(std::string(kArchive) + "version", "3\n"));
  const uint64_t cd_at = offset_;
  std::string cd;
  bool need64 = false;
  for (const Member& m : members_) {
    const bool big = m.size >= 0xffffffffu || m.local_at >= 0xffffffffu;
    need64 = need64 || big;
    put_le(&cd, 0x02014b50, 4);
    put_le(&cd, big ? 45 : 20, 2);
    put_le(&cd, big ? 45 : 20, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 4);
    put_le(&cd, m.crc, 4);
    put_le(&cd, big ? 0xffffffffu : m.size, 4);
    put_le(&cd, big ? 0xffffffffu : m.size, 4);
    put_le(&cd, m.name.size(), 2);
    put_le(&cd, big ? 28 : 0, 2);
    put_le(&cd, 0, 2);  // comment
    put_le(&cd, 0, 2);  // disk
    put_le(&cd, 0, 2);  // internal attributes
    put_le(&cd, 0, 4);  // external attributes
    put_le(&cd, big ? 0xffffffffu : m.local_at, 4);
    cd += m.name;
    if (big) {
      put_le(&cd, 1, 2);
      put_le(&cd, 24, 2);
      put_le(&cd, m.size, 8);
      put_le(&cd, m.size, 8);
      put_le(&cd, m.local_at, 8);
    }
  }
  need64 = need64 || cd_at >= 0xffffffffu || members_.size() >= 0xffff;
  std::string end;
  if (need64) {
    const uint64_t z64_at = cd_at + cd.size();
    put_le(&end, 0x06064b50, 4);
    put_le(&end, 44, 8);
    put_le(&end, 45, 2);
    put_le(&end, 45, 2);
    put_le(&end, 0, 4);
    put_le(&end, 0, 4);
    put_le(&end, members_.size(), 8);
    put_le(&end, members_.size(), 8);
    put_le(&end, cd.size(), 8);
    put_le(&end, cd_at, 8);
    put_le(&end, 0x07064b50, 4);
    put_le(&end, 0, 4);
    put_le(&end, z64_at, 8);
    put_le(&end, 1, 4);
  }
  put_le(&end, 0x06054b50, 4);
  put_le(&end, 0, 2);
  put_le(&end, 0, 2);
  put_le(&end, need64 ? 0xffff : members_.size(), 2);
  put_le(&end, need64 ? 0xffff : members_.size(), 2);
  put_le(&end, need64 ? 0xffffffffu : cd.size(), 4);
  put_le(&end, need64 ? 0xffffffffu : cd_at, 4);
  put_le(&end, 0, 2);
  TESSERA_RETURN_IF_ERROR(write_raw(cd.data(), cd.size()));
  TESSERA_RETURN_IF_ERROR(write_raw(end.data(), end.size()));
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    return internal_error(path_ + ": close failed: " + std::strerror(errno));
  }
  file_ = nullptr;
  finished_ = true;
  file_bytes_ = offset_;
  return Status::ok();
}

}  // namespace tessera
