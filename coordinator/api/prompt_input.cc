#include "coordinator/api/prompt_input.h"

#include <cstdint>

namespace tessera {

using nlohmann::json;

bool all_of_kind(const json& array, bool (json::*pred)() const noexcept) {
  for (const json& e : array)
    if (!(e.*pred)()) return false;
  return true;
}

bool token_ids_from(const json& array, const std::string& param, const Tokenizer* tokenizer,
                    std::vector<int32_t>* ids, ApiError* error) {
  const int64_t vocab = tokenizer != nullptr ? tokenizer->vocab_size() : INT32_MAX;
  for (size_t i = 0; i < array.size(); ++i) {
    const json& e = array[i];
    const int64_t id = e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                           ? INT64_MAX
                           : e.get<int64_t>();
    if (id < 0 || id >= vocab) {
      *error = bad_request(param, "token id " + std::to_string(id) + " at " + param + "[" + std::to_string(i) +
                                      "] is out of range [0, " + std::to_string(vocab) + ")");
      return false;
    }
    ids->push_back(static_cast<int32_t>(id));
  }
  return true;
}

bool read_prompt_input(const json& p, const std::string& param, const Tokenizer* tokenizer,
                       std::vector<std::vector<int32_t>>* prompts, std::vector<std::string>* texts, ApiError* error) {
  const std::string quoted = "'" + param + "'";
  auto need_tokenizer = [&]() {
    *error = bad_request(param, "this server has no tokenizer: send " + quoted + " as token ids");
    return false;
  };
  auto decoded = [&](const std::vector<int32_t>& ids) {
    return tokenizer != nullptr ? tokenizer->decode(ids, false) : std::string();
  };
  if (p.is_string()) {
    if (tokenizer == nullptr) return need_tokenizer();
    texts->push_back(p.get<std::string>());
    prompts->push_back(tokenizer->encode(texts->back(), true));
  } else if (p.is_array() && !p.empty() && all_of_kind(p, &json::is_number_integer)) {
    std::vector<int32_t> ids;
    if (!token_ids_from(p, param, tokenizer, &ids, error)) return false;
    prompts->push_back(std::move(ids));
    texts->push_back(decoded(prompts->back()));
  } else if (p.is_array() && !p.empty() && all_of_kind(p, &json::is_string)) {
    if (tokenizer == nullptr) return need_tokenizer();
    for (const json& s : p) {
      texts->push_back(s.get<std::string>());
      prompts->push_back(tokenizer->encode(texts->back(), true));
    }
  } else if (p.is_array() && !p.empty() && all_of_kind(p, &json::is_array)) {
    for (size_t i = 0; i < p.size(); ++i) {
      const std::string entry = param + "[" + std::to_string(i) + "]";
      if (p[i].empty() || !all_of_kind(p[i], &json::is_number_integer)) {
        *error = bad_request(entry, "'" + entry + "' must be a non-empty array of token ids");
        return false;
      }
      std::vector<int32_t> ids;
      if (!token_ids_from(p[i], entry, tokenizer, &ids, error)) return false;
      prompts->push_back(std::move(ids));
      texts->push_back(decoded(prompts->back()));
    }
  } else {
    *error = bad_request(param, quoted + " must be a string, an array of strings, an array of token ids or an array "
                                "of token-id arrays");
    return false;
  }
  for (size_t i = 0; i < prompts->size(); ++i) {
    if ((*prompts)[i].empty()) {
      *error = bad_request(param, quoted + " is empty (no tokens)" +
                                      (prompts->size() > 1 ? " at " + param + "[" + std::to_string(i) + "]" : ""));
      return false;
    }
  }
  return true;
}

}  // namespace tessera
