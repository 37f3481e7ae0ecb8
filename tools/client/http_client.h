#pragma once
// A small blocking HTTP/1.1 client (Boost.Beast) for Tessera's OpenAI-compatible API, used by
// tessera-cli and the load generator: GET and POST with JSON bodies, an optional
// `Authorization: Bearer` key, timeouts, and a streaming POST that hands over each
// server-sent event's payload (`data: ...`) as it arrives and stops at `data: [DONE]`.
//
// Only plain `http://HOST[:PORT][/PREFIX]` URLs (no TLS). One connection per client, kept
// alive between requests (a reused connection the server has closed is reopened once, before
// any response byte arrived). Not thread-safe: use one client per thread.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera {

// http://HOST[:PORT][/PREFIX]: HOST is a name, an IPv4 address or a bracketed IPv6 address;
// PORT defaults to 80; PREFIX (no trailing '/') is put before every request path.
struct HttpUrl {
  std::string host;
  int port = 80;
  std::string prefix;
  std::string text;  // the URL as given, for messages
};
// InvalidArgument naming the URL for anything else (https://, no scheme, a bad port, ...).
StatusOr<HttpUrl> parse_http_url(const std::string& url);

struct HttpClientOptions {
  std::string api_key;  // sent as `Authorization: Bearer KEY` when not empty
  // Limit on connecting and on each wait for data: sending the request, the response
  // headers, the rest of a body, the next piece of an event stream (an inactivity limit, so
  // a long stream that keeps sending never times out).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  std::string user_agent = "tessera-client";
  bool keep_alive = true;
};

struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // for an event stream: empty (the events went to the callback)
  // The first value of a header, by case-insensitive name; empty when absent.
  std::string header(std::string_view name) const;
};

// One line describing a non-2xx response: "HTTP 400 invalid_request_error (param temperature):
// 'temperature' must be in [0, 2]" from an OpenAI error object, else the status and body.
std::string describe_error_response(const HttpResponse& response);

// Return false to stop reading the stream (the connection is then closed, which makes the
// server abort the request).
using SseCallback = std::function<bool(std::string_view payload)>;

struct HttpStreamResult {
  HttpResponse response;  // status and headers; body holds a non-stream answer (an error object)
  bool done = false;      // `data: [DONE]` arrived
  bool stopped = false;   // the callback returned false
  int events = 0;         // payloads handed to the callback
};

class HttpClient {
 public:
  // InvalidArgument for a URL that parse_http_url rejects. Connects lazily.
  static StatusOr<std::unique_ptr<HttpClient>> create(const std::string& base_url, HttpClientOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  const HttpUrl& url() const;

  // Any status code is a response; Unavailable (naming the URL) when the server cannot be
  // reached, closes the connection early or does not answer within the timeout.
  StatusOr<HttpResponse> get(const std::string& path);
  StatusOr<HttpResponse> post_json(const std::string& path, const std::string& json_body);

  // POST with `Accept: text/event-stream`. When the answer is a 2xx event stream, `on_event`
  // gets every event's data (multi-line data joined by '\n'; comments and other fields
  // skipped) until `[DONE]` (not passed on), the end of the stream or `false`. Any other
  // answer is read whole into response.body.
  StatusOr<HttpStreamResult> post_stream(const std::string& path, const std::string& json_body,
                                         const SseCallback& on_event);

 private:
  struct Impl;
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
