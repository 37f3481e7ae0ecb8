#pragma once
// Which request fields the OpenAI layer implements, and a clear 400 for every other one: a
// field that would change what the client gets must never be accepted and ignored. The
// lists here are the whole contract (docs/api.md, "Request fields"); openai_request.cc reads
// the implemented ones.
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/api/openai_api.h"

namespace tessera {

// True when every non-null field of `body` is one the endpoint implements, or one accepted at
// its no-op value (tools: [], tool_choice: "none", response_format {"type": "text"}, ...).
// Otherwise false with *error a 400 whose param names the first such field, saying why
// (not implemented, not on this endpoint, or an unknown field).
bool check_request_fields(ApiEndpoint endpoint, const nlohmann::json& body, ApiError* error);

// OpenAI's "logit_bias": an object of token id (a decimal string) -> bias in [-100, 100].
// Ids must lie in [0, vocab) (vocab <= 0: unchecked). Returns the pairs sorted by id; false
// with *error a 400 naming "logit_bias" (or "logit_bias.<key>") otherwise.
bool parse_logit_bias(const nlohmann::json& value, int64_t vocab, std::vector<std::pair<int32_t, float>>* out,
                      ApiError* error);

}  // namespace tessera
