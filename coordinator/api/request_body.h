#pragma once
// What every JSON request body must pass before it is parsed (HTTP and the ZeroMQ client
// API alike): no NUL byte, and no nesting deeper than kMaxJsonDepth.
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "coordinator/api/api_error.h"

namespace tessera {

// False (and a 400 in *error) when the body cannot be a request: a raw NUL byte (JSON allows
// none, and the parser would stop at it and ignore whatever follows, accepting
// `{"prompt":"x"}\0{...}`), or nesting deeper than any real request.
bool check_request_body(std::string_view body, ApiError* error);

// The body of a route whose fields are all listed: check_request_body, then a JSON object
// (keys in the client's order) whose every field is in `known` (else a 400 naming it: "'x' is
// not a field of ROUTE"), and whose "model", when given and not empty, names the served model or
// one of its adapters (else a 404 model_not_found).
bool read_request_object(std::string_view body, const std::set<std::string>& known, const std::string& route,
                         const ServedModels& served, nlohmann::ordered_json* out, ApiError* error);

}  // namespace tessera
