// Fuzzes the GGUF reader: the input is one file's bytes, given to GgufFile::parse (header,
// metadata of every value type, nested arrays, tensor table, alignment and bounds checks).
// Invariants: a refusal is a Status whose one-line message starts with the file name; every
// tensor of an accepted file lies inside the input (its first and last byte are read, so a
// pointer past the bytes is an AddressSanitizer report), and every metadata value can be
// walked and read through the typed getters without a crash.
#include <cstdint>
#include <string>
#include <variant>

#include "common/gguf/gguf_file.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// Reads every leaf of a (possibly nested) value.
size_t walk(const tessera::GgufValue& v) {
  if (const auto* array = std::get_if<tessera::GgufArray>(&v.value)) {
    size_t n = 1;
    for (const tessera::GgufValue& item : array->items) n += walk(item);
    return n;
  }
  if (const auto* s = std::get_if<std::string>(&v.value)) return s->empty() ? 1 : static_cast<unsigned char>(s->back());
  return 1;
}

// Each typed read either succeeds or is refused with a message naming the file.
template <typename T>
void check_read(const tessera::StatusOr<T>& r) {
  check(r.is_ok() || r.status().message().rfind("fuzz.gguf: ", 0) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  auto parsed = GgufFile::parse(data, size, "fuzz.gguf");
  if (!parsed.is_ok()) {
    const std::string& message = parsed.status().message();
    check(message.rfind("fuzz.gguf: ", 0) == 0 && message.find('\n') == std::string::npos);
    return 0;
  }
  const GgufFile& file = *parsed.value();
  volatile size_t sink = 0;
  for (const auto& [key, value] : file.metadata()) {
    sink = sink + walk(value);
    check(file.find(key) != nullptr);
    check_read(file.get_uint(key));
    check_read(file.get_int(key));
    check_read(file.get_float(key));
    check_read(file.get_bool(key));
    check_read(file.get_string(key));
    check_read(file.get_string_array(key));
    check_read(file.get_float_array(key));
    check_read(file.get_int_array(key));
  }
  for (const GgufTensor& t : file.tensors()) {
    const GgmlTypeTraits* traits = ggml_type_traits(t.type);
    check(traits != nullptr && t.nbytes > 0 && t.data >= data && t.nbytes <= size - static_cast<size_t>(t.data - data));
    check(static_cast<int64_t>(t.nbytes) == t.numel() / traits->block_elems * traits->block_bytes);
    check(file.find_tensor(t.name) == &t);  // names are unique
    sink = sink + (t.data[0] ^ t.data[t.nbytes - 1]);
  }
  (void)sink;
  return 0;
}
