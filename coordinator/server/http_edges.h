#pragma once
// The edges of the HTTP front end that do not depend on Beast: which request framings are
// refused before a body is read (Transfer-Encoding, Content-Encoding, Host), and the CORS
// policy (server.http.cors_origins) that decides the Access-Control-* headers of responses
// and answers preflight requests. coordinator/server/http_server.cc applies them.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coordinator/api/api_error.h"

namespace tessera {

// What a request's head says about its framing.
struct RequestFraming {
  unsigned version = 11;                            // 10 or 11
  std::optional<std::string> transfer_encoding;     // the field's value, when present
  std::optional<std::string> content_encoding;      // ditto
  int host_fields = 0;                              // how many Host fields it has
};

// The error to answer (the connection is then closed, since the body cannot be framed or
// read), or nullopt when the request may go on. Extra response headers go to `headers`.
std::optional<ApiError> check_request_framing(const RequestFraming& framing,
                                              std::vector<std::pair<std::string, std::string>>* headers);

class CorsPolicy {
 public:
  CorsPolicy() = default;
  // Origins as server.http.cors_origins lists them ("*" = any; config.cc checked the form).
  explicit CorsPolicy(std::vector<std::string> origins);

  bool enabled() const { return !origins_.empty(); }
  bool allows(std::string_view origin) const;
  // Headers for a response to a request from `origin` (empty when it is not allowed or absent).
  std::vector<std::pair<std::string, std::string>> response_headers(std::string_view origin) const;
  // Headers for a preflight answer (OPTIONS with Access-Control-Request-Method) to an
  // allowed origin: the response headers plus the allowed methods, the request headers the
  // browser asked for (Access-Control-Request-Headers) and how long it may cache this.
  std::vector<std::pair<std::string, std::string>> preflight_headers(std::string_view origin,
                                                                     std::string_view allow_methods,
                                                                     std::string_view requested_headers) const;

 private:
  std::vector<std::string> origins_;
  bool any_ = false;
};

}  // namespace tessera
