#include "tools/lib/prompt_ids.h"

#include <climits>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tessera {

StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return invalid_argument(what + ": empty entry in \"" + text + "\"");
    item = item.substr(b, e - b + 1);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return invalid_argument(what + ": \"" + item + "\" is not an integer token id");
    }
  }
  if (ids.empty()) return invalid_argument(what + ": no token ids given");
  return ids;
}

StatusOr<std::vector<std::vector<int32_t>>> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("--prompt-ids-file: cannot open " + path);
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines separate nothing
    auto ids = parse_id_list(line, path + " line " + std::to_string(n));
    if (!ids.is_ok()) return ids.status();
    prompts.push_back(std::move(ids).value());
  }
  if (prompts.empty()) return invalid_argument("--prompt-ids-file: " + path + " holds no prompts");
  return prompts;
}

}  // namespace tessera
