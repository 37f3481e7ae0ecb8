#pragma once
// Little-endian primitives for the wire protocol: a growing writer and a bounds-checked
// reader. Every multi-byte value is written least significant byte first whatever the host;
// arrays of int32 are copied in one go on little-endian hosts. The reader never reads past
// its input and never allocates more than the input could describe: a failed read latches
// an error that the caller turns into a Status.
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::wire {

class WireWriter {
 public:
  explicit WireWriter(std::string* out) : out_(out) {}

  void u8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put_le(v); }
  void u32(uint32_t v) { put_le(v); }
  void u64(uint64_t v) { put_le(v); }
  void i32(int32_t v) { put_le(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { put_le(static_cast<uint64_t>(v)); }
  void f32(float v) { put_le(std::bit_cast<uint32_t>(v)); }
  // u32 byte count, then the bytes.
  void bytes(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_->append(s.data(), s.size());
  }
  // u32 element count, then the elements as little-endian int32.
  void i32_array(const std::vector<int32_t>& v) {
    u32(static_cast<uint32_t>(v.size()));
    if constexpr (std::endian::native == std::endian::little) {
      out_->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
    } else {
      for (int32_t x : v) i32(x);
    }
  }
  size_t size() const { return out_->size(); }
  // Overwrites a u32 written earlier at byte `offset`.
  void patch_u32(size_t offset, uint32_t v) {
    for (int i = 0; i < 4; ++i) (*out_)[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }

 private:
  template <typename T>
  void put_le(T v) {
    char buf[sizeof(T)];
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(buf, &v, sizeof(T));
    } else {
      for (size_t i = 0; i < sizeof(T); ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    }
    out_->append(buf, sizeof(T));
  }

  std::string* out_;
};

class WireReader {
 public:
  explicit WireReader(std::string_view in) : p_(in.data()), end_(in.data() + in.size()) {}

  bool ok() const { return ok_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  // The field being read when the input ran out (for the error message).
  const char* failed_field() const { return failed_field_; }

  uint8_t u8(const char* field) {
    uint8_t v = 0;
    if (take(1, field)) v = static_cast<uint8_t>(p_[-1]);
    return v;
  }
  uint16_t u16(const char* field) { return get_le<uint16_t>(field); }
  uint32_t u32(const char* field) { return get_le<uint32_t>(field); }
  uint64_t u64(const char* field) { return get_le<uint64_t>(field); }
  int32_t i32(const char* field) { return static_cast<int32_t>(get_le<uint32_t>(field)); }
  int64_t i64(const char* field) { return static_cast<int64_t>(get_le<uint64_t>(field)); }
  float f32(const char* field) { return std::bit_cast<float>(get_le<uint32_t>(field)); }
  bool boolean(const char* field) {
    const uint8_t v = u8(field);
    if (v > 1) fail(field);
    return v == 1;
  }
  void bytes(std::string* out, const char* field) {
    const uint32_t n = u32(field);
    if (!ok_) return;
    if (n > remaining()) return fail(field);
    out->assign(p_, n);
    p_ += n;
  }
  // Reuses `out`'s capacity: decoding into a recycled plan does not allocate.
  void i32_array(std::vector<int32_t>* out, const char* field) {
    const uint32_t n = u32(field);
    if (!ok_) return;
    if (static_cast<uint64_t>(n) * 4 > remaining()) return fail(field);
    out->resize(n);
    if constexpr (std::endian::native == std::endian::little) {
      if (n) std::memcpy(out->data(), p_, static_cast<size_t>(n) * 4);
      p_ += static_cast<size_t>(n) * 4;
    } else {
      for (uint32_t i = 0; i < n; ++i) (*out)[i] = i32(field);
    }
  }
  // A count of elements each at least `min_element_bytes` long: rejects counts the rest of
  // the input cannot hold, so garbage never triggers a huge allocation.
  uint32_t count(size_t min_element_bytes, const char* field) {
    const uint32_t n = u32(field);
    if (ok_ && static_cast<uint64_t>(n) * min_element_bytes > remaining()) fail(field);
    return ok_ ? n : 0;
  }
  void fail(const char* field) {
    if (ok_) failed_field_ = field;
    ok_ = false;
    p_ = end_;
  }

 private:
  bool take(size_t n, const char* field) {
    if (!ok_ || remaining() < n) {
      fail(field);
      return false;
    }
    p_ += n;
    return true;
  }
  template <typename T>
  T get_le(const char* field) {
    if (!take(sizeof(T), field)) return 0;
    const char* s = p_ - sizeof(T);
    T v = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, s, sizeof(T));
    } else {
      for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<uint8_t>(s[i])) << (8 * i);
    }
    return v;
  }

  const char* p_;
  const char* end_;
  bool ok_ = true;
  const char* failed_field_ = "";
};

}  // namespace tessera::wire
