#include "common/quantization.h"

#include <charconv>
#include <string>

namespace tessera {

const char* weight_quantization_name(WeightQuantization q) {
  switch (q) {
    case WeightQuantization::kNone: return "none";
    case WeightQuantization::kInt8: return "int8";
    case WeightQuantization::kAuto: return "auto";
    case WeightQuantization::kInt4: return "int4";
  }
  return "?";
}

std::optional<WeightQuantization> parse_weight_quantization(std::string_view name) {
  if (name == "none") return WeightQuantization::kNone;
  if (name == "int8") return WeightQuantization::kInt8;
  if (name == "auto") return WeightQuantization::kAuto;
  if (name == "int4") return WeightQuantization::kInt4;
  return std::nullopt;
}

const char* bf16_coding_name(Bf16Coding c) {
  switch (c) {
    case Bf16Coding::kAuto: return "auto";
    case Bf16Coding::kOn: return "on";
    case Bf16Coding::kOff: return "off";
  }
  return "?";
}

std::optional<Bf16Coding> parse_bf16_coding(std::string_view name) {
  if (name == "auto") return Bf16Coding::kAuto;
  if (name == "on") return Bf16Coding::kOn;
  if (name == "off") return Bf16Coding::kOff;
  return std::nullopt;
}

bool valid_quant_group(int group) {
  return group >= kMinQuantGroup && group <= kMaxQuantGroup && group % 32 == 0;
}

int auto_quant_group(int64_t K) {
  for (int g : {128, 64, 32}) {
    if (K > 0 && K % g == 0) return g;
  }
  return 0;
}

std::optional<int> parse_quant_group(std::string_view text) {
  if (text == "auto") return kAutoQuantGroup;
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !valid_quant_group(v)) return std::nullopt;
  return v;
}

std::string quant_group_name(int group) { return group == kAutoQuantGroup ? "auto" : std::to_string(group); }

}  // namespace tessera
