#include "common/string_util.h"

namespace tessera {

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty() || text.find(from) == std::string_view::npos) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t prev = 0;
  for (size_t pos = text.find(from); pos != std::string_view::npos; pos = text.find(from, prev)) {
    out.append(text, prev, pos - prev);
    out.append(to);
    prev = pos + from.size();
  }
  out.append(text, prev, std::string_view::npos);
  return out;
}

std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace tessera
