#pragma once
// Writes PyTorch checkpoint files byte by byte, as torch.save does, so that the reader's
// tests (good files and every kind of bad one) need neither Python nor torch: a protocol-2
// pickle of a state dict (_rebuild_tensor_v2 with a ('storage', torch.XStorage, key, 'cpu',
// numel) persistent id), the zip format (stored members, optionally zip64 end records and a
// compressed flag) and the legacy format (magic number, protocol, system info, state dict,
// storage keys, raw storages).
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace tessera::testing {

struct FakeTensor {
  std::string name;
  std::string storage_key;
  std::string storage_type = "FloatStorage";
  int64_t storage_numel = 0;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  bool parameter = false;  // wrapped in torch._utils._rebuild_parameter, as nn.Parameter saves
};

class PickleBuilder {
 public:
  PickleBuilder& proto() { return raw("\x80\x02", 2); }
  PickleBuilder& op(char c) {
    out_ += c;
    return *this;
  }
  PickleBuilder& raw(const char* p, size_t n) {
    out_.append(p, n);
    return *this;
  }
  PickleBuilder& str(const std::string& s) {
    op('X');
    le(s.size(), 4);
    out_ += s;
    return *this;
  }
  PickleBuilder& integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      op('M');
      le(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      le(static_cast<uint64_t>(static_cast<uint32_t>(v)), 4);
    } else {  // LONG1 of 8 bytes
      op('\x8a');
      le(8, 1);
      le(static_cast<uint64_t>(v), 8);
    }
    return *this;
  }
  PickleBuilder& global(const std::string& module, const std::string& name) {
    op('c');
    out_ += module + "\n" + name + "\n";
    return *this;
  }
  PickleBuilder& ints_tuple(const std::vector<int64_t>& v) {
    op('(');
    for (int64_t x : v) integer(x);
    return op('t');
  }
  // One tensor value, as torch.save writes it.
  PickleBuilder& tensor(const FakeTensor& t, bool legacy) {
    if (t.parameter) global("torch._utils", "_rebuild_parameter").op('(');
    global("torch._utils", "_rebuild_tensor_v2").op('(');
    op('(').str("storage").global("torch", t.storage_type).str(t.storage_key).str("cpu").integer(t.storage_numel);
    if (legacy) op('N');
    op('t').op('Q');
    integer(t.offset).ints_tuple(t.shape).ints_tuple(t.strides).op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    op('t').op('R');
    if (t.parameter) op('\x89').global("collections", "OrderedDict").op(')').op('R').op('t').op('R');
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

// An OrderedDict state dict (with the _metadata BUILD that module.state_dict() carries).
inline std::string state_dict_pickle(const std::vector<FakeTensor>& tensors, bool legacy = false) {
  PickleBuilder p;
  p.proto().global("collections", "OrderedDict").op(')').op('R').op('(');
  for (const auto& t : tensors) p.str(t.name).tensor(t, legacy);
  p.op('u');
  // BUILD with {'_metadata': {'': {'version': 1}}}
  p.op('}').op('(').str("_metadata").op('}').op('(').str("").op('}').op('(').str("version").integer(1).op('u');
  p.op('u').op('u').op('b').op('.');
  return p.bytes();
}

inline void put_le(std::string* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) *out += static_cast<char>((v >> (8 * i)) & 0xff);
}

struct ZipOptions {
  bool zip64 = false;          // saturated 32-bit fields, real values in zip64 records
  bool compress_flag = false;  // mark every member deflated (method 8)
};

// A zip archive of stored members, each data start padded to 64 bytes as torch aligns them.
inline std::string zip_archive(const std::vector<std::pair<std::string, std::string>>& members, ZipOptions o = {}) {
  std::string out, cd;
  for (const auto& [name, data] : members) {
    const uint64_t local_at = out.size();
    size_t pad = (64 - (local_at + 30 + name.size() + 4) % 64) % 64;
    put_le(&out, 0x04034b50, 4);
    put_le(&out, 20, 2);
    put_le(&out, 0, 2);
    put_le(&out, o.compress_flag ? 8 : 0, 2);
    put_le(&out, 0, 4);  // time, date
    put_le(&out, 0, 4);  // crc (not checked by the reader; torch writes it)
    put_le(&out, data.size(), 4);
    put_le(&out, data.size(), 4);
    put_le(&out, name.size(), 2);
    put_le(&out, 4 + pad, 2);
    out += name;
    put_le(&out, 0x4246, 2);  // torch's "FB" padding extra field
    put_le(&out, pad, 2);
    out.append(pad, 'Z');
    out += data;
    // Central directory entry.
    put_le(&cd, 0x02014b50, 4);
    put_le(&cd, 20, 2);
    put_le(&cd, 20, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, o.compress_flag ? 8 : 0, 2);
    put_le(&cd, 0, 4);
    put_le(&cd, 0, 4);
    put_le(&cd, o.zip64 ? 0xffffffff : data.size(), 4);
    put_le(&cd, o.zip64 ? 0xffffffff : data.size(), 4);
    put_le(&cd, name.size(), 2);
    put_le(&cd, o.zip64 ? 28 : 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 2);
    put_le(&cd, 0, 4);
    put_le(&cd, o.zip64 ? 0xffffffff : local_at, 4);
    cd += name;
    if (o.zip64) {
      put_le(&cd, 1, 2);
      put_le(&cd, 24, 2);
      put_le(&cd, data.size(), 8);
      put_le(&cd, data.size(), 8);
      put_le(&cd, local_at, 8);
    }
  }
  const uint64_t cd_at = out.size();
  out += cd;
  if (o.zip64) {
    const uint64_t z64_at = out.size();
    put_le(&out, 0x06064b50, 4);
    put_le(&out, 44, 8);
    put_le(&out, 45, 2);
    put_le(&out, 45, 2);
    put_le(&out, 0, 4);
    put_le(&out, 0, 4);
    put_le(&out, members.size(), 8);
    put_le(&out, members.size(), 8);
    put_le(&out, cd.size(), 8);
    put_le(&out, cd_at, 8);
    put_le(&out, 0x07064b50, 4);
    put_le(&out, 0, 4);
    put_le(&out, z64_at, 8);
    put_le(&out, 1, 4);
  }
  put_le(&out, 0x06054b50, 4);
  put_le(&out, 0, 2);
  put_le(&out, 0, 2);
  put_le(&out, o.zip64 ? 0xffff : members.size(), 2);
  put_le(&out, o.zip64 ? 0xffff : members.size(), 2);
  put_le(&out, o.zip64 ? 0xffffffff : cd.size(), 4);
  put_le(&out, o.zip64 ? 0xffffffff : cd_at, 4);
  put_le(&out, 0, 2);
  return out;
}

// torch.save's zip layout: archive/data.pkl, archive/byteorder, archive/data/<key>.
inline std::string torch_zip(const std::string& pickle, const std::vector<std::pair<std::string, std::string>>& storages,
                             ZipOptions o = {}) {
  std::vector<std::pair<std::string, std::string>> members{{"archive/data.pkl", pickle}, {"archive/byteorder", "little"}};
  for (const auto& [key, bytes] : storages) members.emplace_back("archive/data/" + key, bytes);
  members.emplace_back("archive/version", "3\n");
  return zip_archive(members, o);
}

// The legacy (pre-1.6) layout; `storages` in the order of the key list, each with its
// element count.
inline std::string torch_legacy(const std::string& pickle,
                                const std::vector<std::pair<std::string, std::pair<int64_t, std::string>>>& storages) {
  std::string out("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
  out += std::string("\x80\x02M\xe9\x03.", 6);
  PickleBuilder sys;
  sys.proto().op('}').op('(').str("protocol_version").integer(1001).str("little_endian").op('\x88').op('u').op('.');
  out += sys.bytes();
  out += pickle;
  PickleBuilder keys;
  keys.proto().op(']').op('(');
  for (const auto& s : storages) keys.str(s.first);
  keys.op('e').op('.');
  out += keys.bytes();
  for (const auto& [key, st] : storages) {
    put_le(&out, static_cast<uint64_t>(st.first), 8);
    out += st.second;
  }
  return out;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace tessera::testing
