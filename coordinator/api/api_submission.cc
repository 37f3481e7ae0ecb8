#include "coordinator/api/api_submission.h"

#include <algorithm>
#include <string>
#include <utility>

namespace tessera {

ApiError api_error(int http_status, std::string type, std::string code, std::string message, std::string param) {
  ApiError e;
  e.http_status = http_status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError api_error_of(const Status& st) {
  switch (st.code()) {
    case StatusCode::kResourceExhausted: return api_error(429, "rate_limit_error", "queue_full", st.message());
    case StatusCode::kUnavailable: return api_error(503, "service_unavailable", "draining", st.message());
    case StatusCode::kInvalidArgument: return bad_request("", st.message());
    default: return api_error(500, "server_error", "internal_error", st.message());
  }
}

ApiError generation_error(const std::string& error, bool unavailable) {
  const std::string why = error.empty() ? std::string("generation failed") : error;
  if (unavailable) return api_error(503, "service_unavailable", "workers_unavailable", why);
  return api_error(500, "server_error", "internal_error", why);
}

bool api_key_accepted(const std::vector<std::string>& keys, std::string_view presented) {
  if (keys.empty()) return true;
  if (presented.empty()) return false;
  for (const std::string& k : keys)
    if (presented == k) return true;
  return false;
}

StatusOr<std::vector<RequestId>> submit_api_request(EngineService& service, const ApiRequest& request,
                                                    ChoiceCallback callback) {
  // Each prompt is one queued request: more than the queue can ever hold would get 429
  // "retry" forever, so it is refused as the client's error, naming the limit.
  const size_t bound = static_cast<size_t>(std::max(service.max_queued_requests(), 0));
  if (request.requests.size() > bound) {
    return invalid_argument("the request has " + std::to_string(request.requests.size()) +
                            " prompts but at most " + std::to_string(bound) +
                            " requests can wait at once (server.max_queued_requests; each prompt is one request): "
                            "send at most " + std::to_string(bound) + " prompts per request");
  }
  std::vector<RequestId> ids;
  ids.reserve(request.requests.size());
  const size_t n = static_cast<size_t>(request.best_of);  // choices generated per prompt
  for (size_t p = 0; p < request.requests.size(); ++p) {
    const size_t first = p * n;  // this prompt's choices are [first, first + n)
    StatusOr<RequestId> id = service.submit(
        request.requests[p], [callback, first](const GenerateEvent& ev) { callback(first + static_cast<size_t>(ev.choice), ev); });
    if (!id.is_ok()) {
      abort_api_request(service, ids);
      return id.status();
    }
    ids.push_back(id.value());
  }
  return ids;
}

void abort_api_request(EngineService& service, const std::vector<RequestId>& ids) {
  for (RequestId id : ids) service.abort(id);
}

}  // namespace tessera
