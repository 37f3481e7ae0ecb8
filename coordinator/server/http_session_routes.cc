#include "coordinator/server/http_session.h"

#include <optional>
#include <string>

#include "coordinator/api/tokenize_api.h"

namespace tessera {

namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// Methods each route answers (the Allow header of a 405 and of OPTIONS); "" = no such route.
// The Batch API's routes: /v1/files[/{id}[/content]], /v1/batches[/{id}[/cancel]]; null for
// any other path.
const char* batch_api_methods(const std::string& path) {
  const auto tail = [&path](std::string_view prefix) -> std::optional<std::string> {
    if (path.rfind(prefix, 0) != 0) return std::nullopt;
    return path.substr(prefix.size());
  };
  if (path == "/v1/files" || path == "/v1/batches") return "GET, HEAD, POST";
  if (std::optional<std::string> t = tail("/v1/files/"); t && !t->empty()) {
    const size_t slash = t->find('/');
    if (slash == std::string::npos) return "GET, HEAD, DELETE";
    return t->substr(slash) == "/content" && slash > 0 ? "GET, HEAD" : "";
  }
  if (std::optional<std::string> t = tail("/v1/batches/"); t && !t->empty()) {
    const size_t slash = t->find('/');
    if (slash == std::string::npos) return "GET, HEAD";
    return t->substr(slash) == "/cancel" && slash > 0 ? "POST" : "";
  }
  return nullptr;
}

const char* route_methods(const std::string& path) {
  if (path == "/health" || path == "/ready" || path == "/metrics" || path == "/v1/models") return "GET, HEAD";
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return "GET, HEAD";
  if (path.rfind("/v1/responses/", 0) == 0 && path.size() > 14) return "GET, HEAD";
  if (path == "/v1/responses") return "POST";
  if (const char* batch = batch_api_methods(path)) return batch;
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/embeddings" || path == "/tokenize" ||
      path == "/detokenize" || path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter")
    return "POST";
  return "";
}

}  // namespace

void HttpSession::handle(const Request& req) {
  std::string path(req.target());
  if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
  const http::verb method = req.method();
  const char* allowed = route_methods(path);
  if (method == http::verb::options) return answer_options(req, path, allowed);
  // Two keys leave it unclear which one the client meant (a proxy may add its own): refused
  // rather than one of them picked.
  if (req.count(http::field::authorization) > 1) {
    return send_error(api_error(400, "invalid_request_error", "duplicate_authorization",
                                "the request has more than one Authorization header; send one"));
  }
  // HEAD is GET without the body (RFC 9110 9.3.2): same status and headers.
  head_ = method == http::verb::head;
  auto route = [&](http::verb want, const char* allow) -> bool {
    if (method == want || (want == http::verb::get && head_)) return true;
    send_error(api_error(405, "invalid_request_error", "method_not_allowed",
                         "method " + std::string(req.method_string()) + " is not allowed on " + path),
               {{"Allow", allow}});
    return false;
  };
  if (path == "/health") {
    if (!route(http::verb::get, allowed)) return;
    return send(200, "application/json",
                server_.draining ? R"({"status":"draining"})" : R"({"status":"ok"})");
  }
  if (path == "/ready") {
    if (!route(http::verb::get, allowed)) return;
    const bool ready =
        !server_.draining && (!server_.owner->ready_check || server_.owner->ready_check());
    return send(ready ? 200 : 503, "application/json",
                ready ? R"({"status":"ready"})" : R"({"status":"not ready"})");
  }
  if (path == "/metrics") {
    if (!route(http::verb::get, allowed)) return;
    EngineServiceStats stats = server_.service.stats();
    if (server_.options.collectives) stats.collectives = server_.options.collectives();
    stats.max_lora = server_.options.lora_max_loras > 0 ? server_.options.lora_max_loras
                                                        : static_cast<int>(server_.api.lora_adapters->snapshot().size());
    return send(200, "text/plain; version=0.0.4; charset=utf-8",
                render_metrics(stats, server_.options.model_name, server_.responses.snapshot(),
                               server_.options.zmq_replies ? server_.options.zmq_replies->snapshot()
                                                           : std::map<int, uint64_t>{}));
  }
  if (*allowed == '\0') {
    return send_error(api_error(404, "invalid_request_error", "not_found", "no route for " + path));
  }
  if (batch_api_methods(path) != nullptr) return handle_batch_api(req, path, allowed);
  const bool is_get = std::string_view(allowed) != "POST";
  if (!route(is_get ? http::verb::get : http::verb::post, allowed)) return;
  if (path == "/tokenize" || path == "/detokenize") {  // outside /v1, unguarded, as vLLM has them
    struct Answer {
      bool ok = false;
      std::string out;
      ApiError error;
    };
    return off_io(
        req.body().size(), [this, tokenize = path == "/tokenize", body = req.body()]() {
          Answer a;
          a.ok = tokenize ? tokenize_body(server_.api, body, &a.out, &a.error)
                          : detokenize_body(server_.api, body, &a.out, &a.error);
          return a;
        },
        [this](Answer a) { a.ok ? send(200, "application/json", std::move(a.out)) : send_error(a.error); });
  }
  const bool is_models = path == "/v1/models";
  const bool is_chat = path == "/v1/chat/completions";
  if (!authorized(req)) {
    return send_error(api_error(401, "invalid_request_error", "invalid_api_key",
                                "missing or invalid API key (send 'Authorization: Bearer <key>')"),
                      {{"WWW-Authenticate", "Bearer"}});
  }
  if (is_models) {
    return send(200, "application/json",
                models_body(server_.api, unix_now()));
  }
  if (is_get && path.rfind("/v1/responses/", 0) == 0) {
    const std::string id = path.substr(std::string_view("/v1/responses/").size());
    std::optional<ResponseStore::Stored> stored = server_.response_store.get(id);
    if (!stored) {
      return send_error(api_error(404, "invalid_request_error", "response_not_found",
                                  "no stored response '" + id + "' (unknown, stored with store: false, or expired)"));
    }
    return send(200, "application/json", stored->response.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (is_get) {  // /v1/models/{id}
    std::string out;
    ApiError error;
    if (!model_card_body(server_.api, path.substr(std::string_view("/v1/models/").size()), unix_now(), &out, &error))
      return send_error(error);
    return send(200, "application/json", std::move(out));
  }
  if (server_.draining) {
    return send_error(api_error(503, "service_unavailable", "draining", "the server is draining"),
                      {{"Retry-After", kRetryAfterSeconds}});
  }
  if (path == "/v1/responses") return start_responses(std::string(req.body()));
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter")
    return update_lora(path == "/v1/load_lora_adapter", std::string(req.body()));
  const ApiEndpoint endpoint = is_chat                       ? ApiEndpoint::kChatCompletions
                               : path == "/v1/embeddings" ? ApiEndpoint::kEmbeddings
                                                          : ApiEndpoint::kCompletions;
  start_generation(endpoint, std::string(req.body()));
}

// OPTIONS (RFC 9110 9.3.7): what the route allows; a CORS preflight from an allowed origin
// also gets the Access-Control-* grant, one from any other origin a 403.
void HttpSession::answer_options(const Request& req, const std::string& path, const char* allowed) {
  if (*allowed == '\0' && path != "*") {
    return send_error(api_error(404, "invalid_request_error", "not_found", "no route for " + path));
  }
  const std::string methods = *allowed == '\0' ? "GET, HEAD, POST, OPTIONS" : std::string(allowed) + ", OPTIONS";
  const bool preflight = !origin_.empty() && req.find(http::field::access_control_request_method) != req.end();
  if (preflight) {
    if (!server_.cors.allows(origin_)) {
      return send_error(api_error(403, "invalid_request_error", "origin_not_allowed",
                                  "origin '" + origin_ + "' is not in server.http.cors_origins"));
    }
    std::string asked;
    if (auto h = req.find(http::field::access_control_request_headers); h != req.end()) asked = std::string(h->value());
    extra_headers_.clear();  // the preflight grant replaces the plain CORS headers
    for (auto& h : server_.cors.preflight_headers(origin_, methods, asked)) extra_headers_.push_back(std::move(h));
  }
  send(204, "", "", {{"Allow", methods}});
}

// The key is "Authorization: Bearer <key>"; whether it is accepted is api_key_accepted's call.
bool HttpSession::authorized(const Request& req) const {
  std::string_view key;
  if (auto it = req.find(http::field::authorization); it != req.end()) {
    const std::string_view v(it->value().data(), it->value().size());
    constexpr std::string_view kBearer = "Bearer ";
    if (v.size() > kBearer.size() && beast::iequals(beast::string_view(v.data(), kBearer.size()),
                                                    beast::string_view(kBearer.data(), kBearer.size())))
      key = v.substr(kBearer.size());
  }
  return api_key_accepted(server_.options.api_keys, key);
}

}  // namespace tessera
