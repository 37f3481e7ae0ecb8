// ggml's tensor types and GGUF's value types: names and block layouts. The rows follow
// llama.cpp's ggml.c type_traits table (names as it prints them, QK_K = 256 for the K, IQ and
// TQ families); the block sizes are the sizeof of its block_* structs in ggml-common.h.
#include <string>

#include "common/gguf/gguf_file.h"

namespace tessera {
namespace {

struct GgmlTypeRow {
  GgmlType type;
  GgmlTypeTraits traits;
};

constexpr GgmlTypeRow kGgmlTypeRows[] = {
    {GgmlType::kF32, {"f32", 1, 4}},
    {GgmlType::kF16, {"f16", 1, 2}},
    {GgmlType::kQ4_0, {"q4_0", 32, 18}},      // f16 scale + 16 bytes of nibbles
    {GgmlType::kQ4_1, {"q4_1", 32, 20}},      // f16 scale and min + 16 bytes
    {GgmlType::kQ5_0, {"q5_0", 32, 22}},      // + 4 bytes of fifth bits
    {GgmlType::kQ5_1, {"q5_1", 32, 24}},
    {GgmlType::kQ8_0, {"q8_0", 32, 34}},      // f16 scale + 32 int8
    {GgmlType::kQ8_1, {"q8_1", 32, 36}},      // f16 scale and sum + 32 int8
    {GgmlType::kQ2_K, {"q2_K", 256, 84}},
    {GgmlType::kQ3_K, {"q3_K", 256, 110}},
    {GgmlType::kQ4_K, {"q4_K", 256, 144}},
    {GgmlType::kQ5_K, {"q5_K", 256, 176}},
    {GgmlType::kQ6_K, {"q6_K", 256, 210}},
    {GgmlType::kQ8_K, {"q8_K", 256, 292}},    // f32 scale + 256 int8 + 16 int16 sums
    {GgmlType::kIQ2_XXS, {"iq2_xxs", 256, 66}},
    {GgmlType::kIQ2_XS, {"iq2_xs", 256, 74}},
    {GgmlType::kIQ3_XXS, {"iq3_xxs", 256, 98}},
    {GgmlType::kIQ1_S, {"iq1_s", 256, 50}},
    {GgmlType::kIQ4_NL, {"iq4_nl", 32, 18}},
    {GgmlType::kIQ3_S, {"iq3_s", 256, 110}},
    {GgmlType::kIQ2_S, {"iq2_s", 256, 82}},
    {GgmlType::kIQ4_XS, {"iq4_xs", 256, 136}},
    {GgmlType::kI8, {"i8", 1, 1}},
    {GgmlType::kI16, {"i16", 1, 2}},
    {GgmlType::kI32, {"i32", 1, 4}},
    {GgmlType::kI64, {"i64", 1, 8}},
    {GgmlType::kF64, {"f64", 1, 8}},
    {GgmlType::kIQ1_M, {"iq1_m", 256, 56}},
    {GgmlType::kBF16, {"bf16", 1, 2}},
    {GgmlType::kTQ1_0, {"tq1_0", 256, 54}},
    {GgmlType::kTQ2_0, {"tq2_0", 256, 66}},
    {GgmlType::kMXFP4, {"mxfp4", 32, 17}},    // e8m0 scale + 16 bytes of e2m1 nibbles
};

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t type) {
  for (const GgmlTypeRow& row : kGgmlTypeRows)
    if (static_cast<uint32_t>(row.type) == type) return &row.traits;
  return nullptr;
}

std::string ggml_type_name(uint32_t type) {
  const GgmlTypeTraits* traits = ggml_type_traits(type);
  return traits != nullptr ? traits->name : "type " + std::to_string(type);
}

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "unknown";
}

}  // namespace tessera
