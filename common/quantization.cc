#include "common/quantization.h"

namespace tessera {

const char* weight_quantization_name(WeightQuantization q) {
  switch (q) {
    case WeightQuantization::kNone: return "none";
    case WeightQuantization::kInt8: return "int8";
  }
  return "?";
}

std::optional<WeightQuantization> parse_weight_quantization(std::string_view name) {
  if (name == "none") return WeightQuantization::kNone;
  if (name == "int8") return WeightQuantization::kInt8;
  return std::nullopt;
}

bool valid_quant_group(int group) {
  return group >= kMinQuantGroup && group <= kMaxQuantGroup && group % 32 == 0;
}

}  // namespace tessera
