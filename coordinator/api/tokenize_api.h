#pragma once
// The vLLM-compatible utility routes beside the OpenAI API: POST /tokenize, POST /detokenize
// (vLLM's request and response shapes) and GET /v1/models/{id} (one model card, as OpenAI's
// "retrieve model"). Each decodes its JSON body strictly (an unknown field, or one of the
// wrong type, is a 400 naming it) and returns the response body or an ApiError.
#include <string>

#include "coordinator/api/openai_api.h"

namespace tessera {

// POST /tokenize: {"prompt": "text", "add_special_tokens": true} or {"messages": [...],
// "tools"?: [...], "add_generation_prompt": true, "add_special_tokens": false} (messages and
// tools read and rendered as chat completions do them), each with optional "model" and
// "return_token_strs" -> {"count", "max_model_len", "tokens", "token_strs"}.
bool tokenize_body(const ApiContext& ctx, const std::string& body, std::string* out, ApiError* error);
// POST /detokenize: {"tokens": [ids], "model"?} -> {"prompt": "text"}.
bool detokenize_body(const ApiContext& ctx, const std::string& body, std::string* out, ApiError* error);
// GET /v1/models/{id}: the served model's card, or a 404 (model_not_found) for any other id.
bool model_card_body(const ApiContext& ctx, const std::string& id, int64_t created, std::string* out,
                     ApiError* error);

}  // namespace tessera
