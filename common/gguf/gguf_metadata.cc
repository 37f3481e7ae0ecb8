// GgufFile's typed metadata reads. The value's variant, not its `type` tag, decides what it is,
// so a GgufValue built by hand with a mismatched tag is refused rather than misread.
#include <cmath>
#include <limits>
#include <string>
#include <variant>

#include "common/gguf/gguf_file.h"

namespace tessera {
namespace {

// "u32", "array of string", "array of array".
std::string gguf_type_text(const GgufValue& v) {
  if (const auto* array = std::get_if<GgufArray>(&v.value))
    return std::string("array of ") + gguf_value_type_name(array->element_type);
  return gguf_value_type_name(v.type);
}

Status gguf_wrong_type(const std::string& file, const std::string& where, const GgufValue& v, const char* wanted) {
  return invalid_argument(file + ": " + where + " has type " + gguf_type_text(v) + ", not " + wanted);
}

std::string gguf_key_text(std::string_view key) { return "metadata key '" + std::string(key) + "'"; }

StatusOr<const GgufValue*> gguf_lookup(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.find(key);
  if (v == nullptr) return not_found(file.path() + ": no " + gguf_key_text(key));
  return v;
}

StatusOr<uint64_t> gguf_as_uint(const GgufValue& v, const std::string& file, const std::string& where) {
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.value)) {
    if (*i < 0)
      return invalid_argument(file + ": " + where + " is " + std::to_string(*i) + ", not an unsigned value");
    return static_cast<uint64_t>(*i);
  }
  return gguf_wrong_type(file, where, v, "an unsigned integer");
}

StatusOr<int64_t> gguf_as_int(const GgufValue& v, const std::string& file, const std::string& where) {
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return invalid_argument(file + ": " + where + " is " + std::to_string(*u) + ", too large for an int64");
    return static_cast<int64_t>(*u);
  }
  return gguf_wrong_type(file, where, v, "an integer");
}

StatusOr<double> gguf_as_float(const GgufValue& v, const std::string& file, const std::string& where) {
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  return gguf_wrong_type(file, where, v, "f32 or f64");
}

StatusOr<std::string> gguf_as_string(const GgufValue& v, const std::string& file, const std::string& where) {
  if (const auto* s = std::get_if<std::string>(&v.value)) return *s;
  return gguf_wrong_type(file, where, v, "string");
}

bool gguf_is_integer_type(GgufValueType t) {
  return t == GgufValueType::kU8 || t == GgufValueType::kI8 || t == GgufValueType::kU16 || t == GgufValueType::kI16 ||
         t == GgufValueType::kU32 || t == GgufValueType::kI32 || t == GgufValueType::kU64 || t == GgufValueType::kI64;
}

// Every item of the array at `key`, converted by `convert` (which names the item in errors);
// the element type must be one `accepts` takes, so an empty array of another type is refused too.
template <typename T, typename Accepts, typename Convert>
StatusOr<std::vector<T>> gguf_array_items(const GgufFile& file, std::string_view key, const char* wanted,
                                          Accepts accepts, Convert convert) {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, gguf_lookup(file, key));
  const std::string where = gguf_key_text(key);
  const auto* array = std::get_if<GgufArray>(&v->value);
  if (array == nullptr || !accepts(array->element_type)) return gguf_wrong_type(file.path(), where, *v, wanted);
  std::vector<T> out;
  out.reserve(array->items.size());
  for (size_t i = 0; i < array->items.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(T item, convert(array->items[i], file.path(), where + " item " + std::to_string(i)));
    out.push_back(std::move(item));
  }
  return out;
}

}  // namespace

StatusOr<uint64_t> GgufFile::get_uint(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, gguf_lookup(*this, key));
  return gguf_as_uint(*v, path_, gguf_key_text(key));
}

StatusOr<int64_t> GgufFile::get_int(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, gguf_lookup(*this, key));
  return gguf_as_int(*v, path_, gguf_key_text(key));
}

StatusOr<double> GgufFile::get_float(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, gguf_lookup(*this, key));
  return gguf_as_float(*v, path_, gguf_key_text(key));
}

StatusOr<bool> GgufFile::get_bool(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, gguf_lookup(*this, key));
  if (const auto* b = std::get_if<bool>(&v->value)) return *b;
  return gguf_wrong_type(path_, gguf_key_text(key), *v, "bool");
}

StatusOr<std::string> GgufFile::get_string(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, gguf_lookup(*this, key));
  return gguf_as_string(*v, path_, gguf_key_text(key));
}

StatusOr<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  return gguf_array_items<std::string>(
      *this, key, "array of string", [](GgufValueType t) { return t == GgufValueType::kString; }, gguf_as_string);
}

StatusOr<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const auto accepts = [](GgufValueType t) { return t == GgufValueType::kF32 || t == GgufValueType::kF64; };
  const auto convert = [](const GgufValue& v, const std::string& file, const std::string& where) -> StatusOr<float> {
    TESSERA_ASSIGN_OR_RETURN(double d, gguf_as_float(v, file, where));
    // Converting a finite double beyond float's range is undefined behaviour, not infinity.
    if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max())
      return invalid_argument(file + ": " + where + " is " + std::to_string(d) + ", beyond the range of f32");
    return static_cast<float>(d);
  };
  return gguf_array_items<float>(*this, key, "array of f32 or f64", accepts, convert);
}

StatusOr<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  return gguf_array_items<int64_t>(*this, key, "array of integers", gguf_is_integer_type, gguf_as_int);
}

}  // namespace tessera
