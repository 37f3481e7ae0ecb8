#include "coordinator/api/api_error.h"

#include <nlohmann/json.hpp>

#include "coordinator/api/response_json.h"

namespace tessera {

using nlohmann::json;

ApiError api_server_error(std::string message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.code = "internal_error";
  e.message = std::move(message);
  return e;
}

ApiError bad_request(std::string param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

std::string error_body(const ApiError& error) {
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return response_json(json{{"error", e}});
}

bool ServedModels::find(const std::string& asked, std::string* adapter) const {
  adapter->clear();
  if (asked.empty() || asked == base) return true;
  if (adapters.count(asked) == 0) return false;
  *adapter = asked;
  return true;
}

ApiError model_not_found(const std::string& asked, const ServedModels& served, std::string param) {
  ApiError e;
  e.http_status = 404;
  e.param = std::move(param);
  e.code = "model_not_found";
  std::string names = "'" + served.base + "'";
  if (!served.adapters.empty()) {
    names += " and the LoRA adapter" + std::string(served.adapters.size() > 1 ? "s" : "");
    const char* sep = " ";
    for (const auto& [name, path] : served.adapters) {
      names += sep + ("'" + name + "'");
      sep = ", ";
    }
  }
  e.message = "The model '" + asked + "' does not exist (this server serves " + names + ")";
  return e;
}

}  // namespace tessera
