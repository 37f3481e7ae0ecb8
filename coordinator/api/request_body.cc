#include "coordinator/api/request_body.h"

#include <string>

#include "coordinator/api/tool_calls/tool_call_format.h"

namespace tessera {

bool check_request_body(std::string_view body, ApiError* error) {
  if (const size_t nul = body.find('\0'); nul != std::string_view::npos) {
    *error = bad_request("", "the request body is not valid JSON: a NUL byte at offset " + std::to_string(nul));
    return false;
  }
  // Values are copied and converted recursively after parsing: a body nested deeper than any
  // real request is refused before it is parsed.
  if (json_nesting_depth(body) > kMaxJsonDepth) {
    *error = bad_request("", "the request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return false;
  }
  return true;
}

}  // namespace tessera
