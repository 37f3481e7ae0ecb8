#pragma once
// The text of a JSON response body. Generated text can hold invalid UTF-8 (a token cut inside
// a character, a client's bytes echoed back); such bytes become U+FFFD instead of an exception
// from nlohmann::json, so a response is always sent.
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

inline std::string response_json(const nlohmann::json& body) {
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tessera
