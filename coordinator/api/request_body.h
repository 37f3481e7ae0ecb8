#pragma once
// What every JSON request body must pass before it is parsed (HTTP and the ZeroMQ client
// API alike): no NUL byte, and no nesting deeper than kMaxJsonDepth.
#include <string_view>

#include "coordinator/api/api_error.h"

namespace tessera {

// False (and a 400 in *error) when the body cannot be a request: a raw NUL byte (JSON allows
// none, and the parser would stop at it and ignore whatever follows, accepting
// `{"prompt":"x"}\0{...}`), or nesting deeper than any real request.
bool check_request_body(std::string_view body, ApiError* error);

}  // namespace tessera
