#include "tools/client/http_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>

namespace tessera {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string seconds_text(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return std::to_string(ms.count() / 1000) + " s";
  return std::to_string(ms.count()) + " ms";
}

// Events of a text/event-stream body, fed in pieces as they arrive.
class SseParser {
 public:
  // Calls on_data(payload) per complete event with data; returns false when it said stop.
  template <typename F>
  bool feed(std::string_view bytes, F&& on_data) {
    pending_.append(bytes);
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(pending_.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) {
        if (has_data_) {
          has_data_ = false;
          std::string payload = std::move(data_);
          data_.clear();
          if (!on_data(payload)) {
            pending_.erase(0, nl + 1);
            return false;
          }
        }
        continue;
      }
      if (line.front() == ':') continue;  // a comment (keep-alive)
      const size_t colon = line.find(':');
      const std::string_view field = line.substr(0, colon);
      std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (field != "data") continue;  // event:, id:, retry: do not matter here
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
    pending_.erase(0, start);
    return true;
  }

 private:
  std::string pending_;  // bytes after the last complete line
  std::string data_;
  bool has_data_ = false;
};

}  // namespace

StatusOr<HttpUrl> parse_http_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return invalid_argument("URL '" + url + "': " + why + " (expected http://HOST:PORT)");
  };
  const std::string scheme = "http://";
  const size_t sep = url.find("://");
  if (sep == std::string::npos) return bad("no http:// scheme");
  if (!iequal(std::string_view(url).substr(0, sep + 3), scheme)) {
    return bad("scheme '" + url.substr(0, sep) + "' is not supported, only plain http");
  }
  HttpUrl out;
  out.text = url;
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find_first_of("/?#");
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) {
    if (rest[slash] != '/') return bad("a query or fragment is not allowed");
    out.prefix = rest.substr(slash);
    while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  }
  if (authority.find('@') != std::string::npos) return bad("user information is not supported");
  std::string port_text;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return bad("unterminated IPv6 address");
    out.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("unexpected text after the IPv6 address");
      port_text = after.substr(1);
      if (port_text.empty()) return bad("empty port");
    }
  } else {
    const size_t colon = authority.rfind(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("empty port");
    }
  }
  if (out.host.empty()) return bad("no host");
  if (!port_text.empty()) {
    if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
      return bad("port '" + port_text + "' is not a number in [1, 65535]");
    }
    out.port = std::stoi(port_text);
    if (out.port < 1 || out.port > 65535) return bad("port '" + port_text + "' is not a number in [1, 65535]");
  }
  return out;
}

std::string HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequal(k, name)) return v;
  }
  return "";
}

std::string describe_error_response(const HttpResponse& r) {
  std::string out = "HTTP " + std::to_string(r.status);
  const auto j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const auto& e = j["error"];
    auto text = [&](const char* key) {
      auto it = e.find(key);
      return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (!text("type").empty()) out += " " + text("type");
    if (!text("code").empty()) out += " [" + text("code") + "]";
    if (!text("param").empty()) out += " (param " + text("param") + ")";
    return out + ": " + (text("message").empty() ? e.dump() : text("message"));
  }
  std::string body = r.body.substr(0, 300);
  for (char& c : body) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!body.empty() && body.back() == ' ') body.pop_back();
  return body.empty() ? out : out + ": " + body;
}

struct HttpClient::Impl {
  HttpUrl url;
  HttpClientOptions options;
  std::string host_header;
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs the io_context until the operation started just before has completed.
  void run() {
    ioc.restart();
    ioc.run();
  }

  void close() {
    if (stream) {
      beast::error_code ignored;
      stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream->close();
      stream.reset();
    }
    buffer.clear();
  }

  std::string where(http::verb verb, const std::string& target) const {
    return std::string(http::to_string(verb)) + " http://" + host_header + target;
  }

  Status unavailable(const std::string& what, const std::string& detail) const {
    return Status(StatusCode::kUnavailable, what + ": " + detail);
  }

  Status io_error(const std::string& what, beast::error_code ec, const std::string& waiting_for) const {
    if (ec == beast::error::timeout) {
      return unavailable(what, "timed out after " + seconds_text(options.timeout) + " " + waiting_for);
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message) {
      return unavailable(what, "the server closed the connection (" + waiting_for + ")");
    }
    return unavailable(what, ec.message() + " (" + waiting_for + ")");
  }

  Status connect(const std::string& what) {
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    auto endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
    if (ec) return unavailable(what, "cannot resolve host '" + url.host + "': " + ec.message());
    stream.emplace(ioc);
    stream->expires_after(options.timeout);
    stream->async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec) {
      stream.reset();
      if (ec == beast::error::timeout) {
        return unavailable(what, "cannot connect: timed out after " + seconds_text(options.timeout));
      }
      return unavailable(what, "cannot connect: " + ec.message());
    }
    stream->socket().set_option(tcp::no_delay(true), ec);
    buffer.clear();
    return Status::ok();
  }

  http::request<http::string_body> make_request(http::verb verb, const std::string& target, const std::string* body,
                                                bool event_stream) const {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, host_header);
    req.set(http::field::user_agent, options.user_agent);
    req.set(http::field::accept, event_stream ? "text/event-stream" : "application/json");
    if (!options.api_key.empty()) req.set(http::field::authorization, "Bearer " + options.api_key);
    if (body != nullptr) {
      req.set(http::field::content_type, "application/json");
      req.body() = *body;
    }
    req.keep_alive(options.keep_alive);
    req.prepare_payload();
    return req;
  }

  static void copy_head(const http::response_parser<http::string_body>& parser, HttpResponse* out) {
    const auto& msg = parser.get();
    out->status = static_cast<int>(msg.result_int());
    out->headers.clear();
    for (const auto& field : msg) {
      out->headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
  }

  // Sends the request and reads the response; `on_event` (may be null) takes a 2xx event
  // stream's payloads.
  StatusOr<HttpStreamResult> exchange(http::verb verb, const std::string& path, const std::string* body,
                                      const SseCallback* on_event) {
    const std::string target = url.prefix + (path.empty() || path.front() != '/' ? "/" : "") + path;
    const std::string what = where(verb, target);
    auto req = make_request(verb, target, body, on_event != nullptr);
    for (int attempt = 0;; ++attempt) {
      const bool reused = stream.has_value();
      if (!stream) TESSERA_RETURN_IF_ERROR(connect(what));
      beast::error_code ec;
      stream->expires_after(options.timeout);
      http::async_write(*stream, req, [&](beast::error_code e, size_t) { ec = e; });
      run();
      http::response_parser<http::string_body> parser;
      // No limit (boost::none would be the way, but Boost 1.74 compares lengths against it wrongly).
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      if (!ec) {
        stream->expires_after(options.timeout);
        http::async_read_header(*stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
        run();
      }
      if (ec) {
        close();
        // The server may have closed an idle kept-alive connection: reopen it once.
        if (reused && attempt == 0 && ec != beast::error::timeout) continue;
        return io_error(what, ec, "waiting for the response");
      }
      HttpStreamResult result;
      copy_head(parser, &result.response);
      const int status = result.response.status;
      const bool is_stream = on_event != nullptr && status / 100 == 2 &&
                             result.response.header("content-type").rfind("text/event-stream", 0) == 0;
      if (!is_stream) {
        if (!parser.is_done()) {
          stream->expires_after(options.timeout);
          http::async_read(*stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
          run();
          if (ec) {
            close();
            return io_error(what, ec, "reading the response body");
          }
        }
        result.response.body = std::move(parser.get().body());
        if (!parser.keep_alive()) close();
        return result;
      }
      SseParser sse;
      bool keep_going = true;
      auto deliver = [&](const std::string& payload) {
        if (result.done) return true;  // nothing is expected after [DONE]; read to the end
        if (payload == "[DONE]") {
          result.done = true;
          return true;
        }
        ++result.events;
        if (!(*on_event)(payload)) {
          result.stopped = true;
          return false;
        }
        return true;
      };
      while (true) {
        std::string& got = parser.get().body();
        if (!got.empty()) {
          keep_going = sse.feed(got, deliver);
          got.clear();
        }
        if (!keep_going || parser.is_done()) break;
        stream->expires_after(options.timeout);
        http::async_read_some(*stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
        run();
        if (ec) {
          close();
          // The stream simply ended (a server without chunked encoding): whatever came is
          // the answer; the caller sees done == false if [DONE] never came.
          if (ec == http::error::end_of_stream || ec == asio::error::eof) return result;
          return io_error(what, ec, "reading the event stream");
        }
      }
      if (result.stopped || !parser.is_done() || !parser.keep_alive()) close();
      return result;
    }
  }
};

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpClient::~HttpClient() {
  if (impl_) impl_->close();
}

StatusOr<std::unique_ptr<HttpClient>> HttpClient::create(const std::string& base_url, HttpClientOptions options) {
  TESSERA_ASSIGN_OR_RETURN(HttpUrl url, parse_http_url(base_url));
  if (options.timeout.count() <= 0) return invalid_argument("HTTP client timeout must be positive");
  auto impl = std::make_unique<Impl>();
  impl->host_header = (url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host) + ":" +
                      std::to_string(url.port);
  impl->url = std::move(url);
  impl->options = std::move(options);
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

const HttpUrl& HttpClient::url() const { return impl_->url; }

StatusOr<HttpResponse> HttpClient::get(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(HttpStreamResult r, impl_->exchange(http::verb::get, path, nullptr, nullptr));
  return std::move(r.response);
}

StatusOr<HttpResponse> HttpClient::post_json(const std::string& path, const std::string& json_body) {
  TESSERA_ASSIGN_OR_RETURN(HttpStreamResult r, impl_->exchange(http::verb::post, path, &json_body, nullptr));
  return std::move(r.response);
}

StatusOr<HttpStreamResult> HttpClient::post_stream(const std::string& path, const std::string& json_body,
                                                   const SseCallback& on_event) {
  return impl_->exchange(http::verb::post, path, &json_body, &on_event);
}

}  // namespace tessera
