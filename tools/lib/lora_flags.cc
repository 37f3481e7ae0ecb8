#include "tools/lib/lora_flags.h"

#include "common/config.h"

namespace tessera {

StatusOr<std::map<std::string, std::string>> lora_adapters_from_flags(const std::vector<std::string>& flags) {
  std::map<std::string, std::string> out;
  for (const std::string& f : flags) {
    const size_t eq = f.find('=');
    const std::string name = eq == std::string::npos ? "" : f.substr(0, eq);
    if (eq == std::string::npos || eq + 1 == f.size() || !valid_lora_name(name))
      return invalid_argument("--lora: expected NAME=PATH (NAME of letters, digits and . _ - : /, up to 128), got \"" +
                              f + "\"");
    if (!out.emplace(name, f.substr(eq + 1)).second) return invalid_argument("--lora: adapter \"" + name + "\" given twice");
  }
  return out;
}

}  // namespace tessera
