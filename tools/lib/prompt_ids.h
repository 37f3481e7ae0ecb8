#pragma once
// Token-id prompts as the command-line programs take them: "1,2,3" (--prompt-ids), and a file
// of one such list per line (--prompt-ids-file; blank lines skipped). Errors name the flag or
// the file and line, and the entry that is not an integer.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what);
StatusOr<std::vector<std::vector<int32_t>>> read_prompt_file(const std::string& path);

}  // namespace tessera
