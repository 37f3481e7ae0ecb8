#include "coordinator/server/http_edges.h"

#include <algorithm>
#include <cctype>

namespace tessera {
namespace {

std::string lower_trimmed(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  std::string out(s.substr(b, e - b));
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The comma-separated codings of a Transfer-Encoding or Content-Encoding value, lowercased.
std::vector<std::string> codings(std::string_view value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= value.size()) {
    const size_t comma = std::min(value.find(',', start), value.size());
    std::string c = lower_trimmed(value.substr(start, comma - start));
    if (const size_t semi = c.find(';'); semi != std::string::npos) c = lower_trimmed(c.substr(0, semi));
    out.push_back(std::move(c));
    start = comma + 1;
  }
  return out;
}

ApiError framing_error(int status, const std::string& code, const std::string& message) {
  ApiError e;
  e.http_status = status;
  e.type = "invalid_request_error";
  e.code = code;
  e.message = message;
  return e;
}

}  // namespace

std::optional<ApiError> check_request_framing(const RequestFraming& f,
                                              std::vector<std::pair<std::string, std::string>>* headers) {
  if (f.transfer_encoding) {
    // RFC 9112 6.1: a server that receives a transfer coding it does not understand SHOULD
    // answer 501 (Not Implemented); the only one Tessera decodes is chunked. Since the body
    // length is then unknown (6.3), the connection is closed after the answer, so the body
    // is never read as a next request. "chunked" alone is what Beast reads.
    const std::vector<std::string> te = codings(*f.transfer_encoding);
    for (const std::string& c : te) {
      if (c != "chunked") {
        return framing_error(501, "unsupported_transfer_encoding",
                             "Transfer-Encoding '" + *f.transfer_encoding +
                                 "' is not supported: only 'chunked' is (RFC 9112 section 6.1)");
      }
    }
    if (te.size() != 1) {  // "chunked, chunked": RFC 9112 7 forbids chunking twice
      return framing_error(400, "bad_transfer_encoding",
                           "Transfer-Encoding '" + *f.transfer_encoding + "' applies chunked more than once");
    }
    if (f.version == 10) {  // RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding is faulty
      return framing_error(400, "bad_transfer_encoding", "Transfer-Encoding is not allowed in an HTTP/1.0 request");
    }
  }
  if (f.content_encoding) {
    // RFC 9110 15.5.16: a request body in a content coding the server does not accept gets
    // 415 (Unsupported Media Type), with Accept-Encoding saying what it does accept (12.5.3).
    for (const std::string& c : codings(*f.content_encoding)) {
      if (c != "identity") {
        headers->emplace_back("Accept-Encoding", "identity");
        return framing_error(415, "unsupported_content_encoding",
                             "Content-Encoding '" + *f.content_encoding +
                                 "' is not supported: send the body uncompressed (identity)");
      }
    }
  }
  // RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host field, or
  // with more than one.
  if (f.version == 11 && f.host_fields != 1) {
    return framing_error(400, "bad_host",
                         f.host_fields == 0 ? "an HTTP/1.1 request must have a Host header (RFC 9112 section 3.2)"
                                            : "a request must not have more than one Host header");
  }
  return std::nullopt;
}

CorsPolicy::CorsPolicy(std::vector<std::string> origins) : origins_(std::move(origins)) {
  any_ = std::find(origins_.begin(), origins_.end(), "*") != origins_.end();
}

bool CorsPolicy::allows(std::string_view origin) const {
  if (origin.empty() || origins_.empty()) return false;
  if (any_) return true;
  // Origins compare as strings (RFC 6454 serialization); the scheme and host are
  // case-insensitive, so compare lowercased.
  const std::string o = lower_trimmed(origin);
  return std::any_of(origins_.begin(), origins_.end(), [&](const std::string& a) { return lower_trimmed(a) == o; });
}

std::vector<std::pair<std::string, std::string>> CorsPolicy::response_headers(std::string_view origin) const {
  std::vector<std::pair<std::string, std::string>> h;
  if (!allows(origin)) return h;
  if (any_) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    // Naming the origin makes the answer depend on it: caches must key on Origin.
    h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    h.emplace_back("Vary", "Origin");
  }
  // Scripts may read these of our answers (rate-limit and retry hints).
  h.emplace_back("Access-Control-Expose-Headers", "Retry-After, Content-Type");
  return h;
}

std::vector<std::pair<std::string, std::string>> CorsPolicy::preflight_headers(
    std::string_view origin, std::string_view allow_methods, std::string_view requested_headers) const {
  std::vector<std::pair<std::string, std::string>> h = response_headers(origin);
  if (h.empty()) return h;
  h.emplace_back("Access-Control-Allow-Methods", std::string(allow_methods));
  // Any request header is allowed (the API key travels in Authorization, JSON bodies need
  // Content-Type, and the OpenAI SDKs add their own): the browser's list is granted as asked.
  const std::string asked = lower_trimmed(requested_headers);
  h.emplace_back("Access-Control-Allow-Headers", asked.empty() ? "authorization, content-type" : asked);
  h.emplace_back("Access-Control-Max-Age", "600");
  // The answer echoes the asked-for headers, so it varies with them too.
  auto vary = std::find_if(h.begin(), h.end(), [](const auto& kv) { return kv.first == "Vary"; });
  if (vary != h.end()) {
    vary->second += ", Access-Control-Request-Headers";
  } else {
    h.emplace_back("Vary", "Access-Control-Request-Headers");
  }
  return h;
}

}  // namespace tessera
