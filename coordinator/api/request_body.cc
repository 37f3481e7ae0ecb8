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

bool read_request_object(std::string_view body, const std::set<std::string>& known, const std::string& route,
                         const ServedModels& served, nlohmann::ordered_json* out, ApiError* error) {
  if (!check_request_body(body, error)) return false;
  *out = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object()) {
    *error = bad_request("", out->is_discarded() ? "the request body is not valid JSON" : "the request body must be a JSON object");
    return false;
  }
  for (const auto& [key, value] : out->items()) {
    if (!known.count(key)) {
      *error = bad_request(key, "'" + key + "' is not a field of " + route);
      return false;
    }
  }
  if (auto m = out->find("model"); m != out->end() && !m->is_null()) {
    if (!m->is_string()) {
      *error = bad_request("model", "'model' must be a string");
      return false;
    }
    std::string adapter;
    if (!served.find(m->get<std::string>(), &adapter)) {
      *error = model_not_found(m->get<std::string>(), served);
      return false;
    }
  }
  return true;
}

}  // namespace tessera
