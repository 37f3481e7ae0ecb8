#pragma once
// Little-endian primitives for the wire protocol: a growing writer and a bounds-checked
// reader. Every multi-byte value is written least significant byte first whatever the host;
// arrays of int32 are copied in one go on little-endian hosts. The reader never reads past
// its input and never allocates more than the input could describe: a failed read latches
// an error that the caller turns into a Status.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::wire {

class WireWriter {
 public:
  // Writes into *out from byte `start` on (default: appends), overwriting what is there and
  // growing it geometrically; finish() (or the destructor) cuts it to the bytes written.
  // Rewriting a recycled buffer of the same size costs no allocation and no zero-fill.
  explicit WireWriter(std::string* out) : out_(out), used_(out->size()) {}
  WireWriter(std::string* out, size_t start) : out_(out), used_(start) {}
  ~WireWriter() { finish(); }

  void u8(uint8_t v) {
    ensure(1);
    out_->data()[used_++] = static_cast<char>(v);
  }
  void u16(uint16_t v) { put_le(v); }
  void u32(uint32_t v) { put_le(v); }
  void u64(uint64_t v) { put_le(v); }
  void i32(int32_t v) { put_le(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { put_le(static_cast<uint64_t>(v)); }
  void f32(float v) { put_le(std::bit_cast<uint32_t>(v)); }
  // u32 byte count, then the bytes.
  void bytes(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  // u32 element count, then the elements as little-endian int32 / float32.
  void i32_array(const std::vector<int32_t>& v) { array32(v); }
  void f32_array(const std::vector<float>& v) { array32(v); }
  void u32_array(const std::vector<uint32_t>& v) { array32(v); }
  size_t size() const { return used_; }
  // Overwrites a u32 written earlier at byte `offset`.
  void patch_u32(size_t offset, uint32_t v) {
    for (int i = 0; i < 4; ++i) (*out_)[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  // Makes out->size() the number of bytes written.
  void finish() {
    if (out_->size() != used_) out_->resize(used_);
  }

 private:
  template <typename T>
  void array32(const std::vector<T>& v) {
    static_assert(sizeof(T) == 4);
    u32(static_cast<uint32_t>(v.size()));
    if constexpr (std::endian::native == std::endian::little) {
      raw(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    } else {
      for (T x : v) put_le(std::bit_cast<uint32_t>(x));
    }
  }
  void ensure(size_t n) {
    if (out_->size() - used_ >= n) return;
    const size_t want = std::max(used_ + n, std::max<size_t>(64, out_->capacity()));
    out_->resize(std::max(want, 2 * out_->size()));
  }
  void raw(const char* p, size_t n) {
    ensure(n);
    if (n) std::memcpy(out_->data() + used_, p, n);
    used_ += n;
  }
  template <typename T>
  void put_le(T v) {
    ensure(sizeof(T));
    char* dst = out_->data() + used_;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(dst, &v, sizeof(T));
    } else {
      for (size_t i = 0; i < sizeof(T); ++i) dst[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    }
    used_ += sizeof(T);
  }

  std::string* out_;
  size_t used_;
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
  void i32_array(std::vector<int32_t>* out, const char* field) { array32(out, field); }
  void f32_array(std::vector<float>* out, const char* field) { array32(out, field); }
  void u32_array(std::vector<uint32_t>* out, const char* field) { array32(out, field); }
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
  template <typename T>
  void array32(std::vector<T>* out, const char* field) {
    static_assert(sizeof(T) == 4);
    const uint32_t n = u32(field);
    if (!ok_) return;
    if (static_cast<uint64_t>(n) * 4 > remaining()) return fail(field);
    out->resize(n);
    if constexpr (std::endian::native == std::endian::little) {
      if (n) std::memcpy(out->data(), p_, static_cast<size_t>(n) * 4);
      p_ += static_cast<size_t>(n) * 4;
    } else {
      for (uint32_t i = 0; i < n; ++i) (*out)[i] = std::bit_cast<T>(get_le<uint32_t>(field));
    }
  }
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
