#include "common/weights_budget.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>

namespace tessera {
namespace {

constexpr std::pair<std::string_view, int64_t> kUnits[] = {
    {"KiB", int64_t{1} << 10}, {"MiB", int64_t{1} << 20}, {"GiB", int64_t{1} << 30}, {"TiB", int64_t{1} << 40},
    {"KB", 1000},              {"MB", 1000000},           {"GB", 1000000000},        {"TB", 1000000000000},
    {"B", 1},
};

Status bad(std::string_view text, const std::string& why) {
  return invalid_argument("'" + std::string(text) + "' " + why +
                          " (expected all, a byte count such as 6GiB, 500MB or 1048576, or a share of the "
                          "rank's weights such as 25%)");
}

}  // namespace

int64_t WeightsBudget::bytes_for(int64_t weight_bytes) const {
  if (bytes >= 0) return bytes;
  if (share > 0) return static_cast<int64_t>(std::floor(share * static_cast<double>(weight_bytes)));
  return weight_bytes;
}

std::string WeightsBudget::to_string() const {
  if (bytes >= 0) return std::to_string(bytes);
  if (share > 0) {
    std::string s = std::to_string(share * 100);
    while (s.find('.') != std::string::npos && (s.back() == '0' || s.back() == '.')) s.pop_back();
    return s + "%";
  }
  return "all";
}

StatusOr<WeightsBudget> parse_weights_budget(std::string_view text) {
  WeightsBudget b;
  if (text.empty() || text == "all") return b;
  if (text.back() == '%') {
    const std::string_view number = text.substr(0, text.size() - 1);
    double pct = 0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), pct);
    if (ec != std::errc() || end != number.data() + number.size()) return bad(text, "is not a number followed by %");
    if (!(pct > 0 && pct < 100)) return bad(text, "must be above 0% and below 100% (100% is all)");
    b.share = pct / 100;
    return b;
  }
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return bad(text, "does not start with a number");
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, value);
  if (ec != std::errc() || end != text.data() + digits) return bad(text, "is out of range");
  std::string_view unit = text.substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  int64_t scale = unit.empty() ? 1 : 0;
  for (const auto& [name, factor] : kUnits)
    if (unit == name) scale = factor;
  if (scale == 0) return bad(text, "has an unknown unit '" + std::string(unit) + "'");
  if (value == 0) return bad(text, "is zero");
  if (value > INT64_MAX / scale) return bad(text, "is out of range");
  b.bytes = value * scale;
  return b;
}

const char* weight_streaming_name(WeightStreaming s) {
  switch (s) {
    case WeightStreaming::kMap: return "map";
    case WeightStreaming::kRead: return "read";
    case WeightStreaming::kDirect: return "direct";
  }
  return "?";
}

StatusOr<WeightStreaming> parse_weight_streaming(std::string_view text) {
  for (WeightStreaming s : {WeightStreaming::kMap, WeightStreaming::kRead, WeightStreaming::kDirect})
    if (text == weight_streaming_name(s)) return s;
  return invalid_argument("'" + std::string(text) + "' is not a way to stream weights (expected map, read or direct)");
}

}  // namespace tessera
