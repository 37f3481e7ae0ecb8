#pragma once
// The input shapes OpenAI's APIs take for text to run the model on — completions' "prompt",
// embeddings' "input": a string, an array of strings (a batch), an array of token ids, or an
// array of token-id arrays (a batch) — read into token ids, each string tokenized with the
// tokenizer's special tokens (BOS and the like) as the model expects.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/api_error.h"

namespace tessera {

// Whether every element of the JSON array satisfies `pred` (json::is_string, ...).
bool all_of_kind(const nlohmann::json& array, bool (nlohmann::json::*pred)() const noexcept);
// Appends the integers of `array` to *ids; false with a 400 naming `param` when one lies
// outside [0, the tokenizer's vocabulary) (no tokenizer: [0, 2^31)).
bool token_ids_from(const nlohmann::json& array, const std::string& param, const Tokenizer* tokenizer,
                    std::vector<int32_t>* ids, ApiError* error);

// `value` is the field `param` of the body (present, not null). Fills *prompts (one per batch
// entry, none empty) and *texts (the text of each, decoded when given as ids; "" without a
// tokenizer). False with *error a 400 naming `param` (or `param[i]`) otherwise: a wrong shape,
// an id outside the vocabulary, text on a server without a tokenizer, an empty entry.
bool read_prompt_input(const nlohmann::json& value, const std::string& param, const Tokenizer* tokenizer,
                       std::vector<std::vector<int32_t>>* prompts, std::vector<std::string>* texts, ApiError* error);

}  // namespace tessera
