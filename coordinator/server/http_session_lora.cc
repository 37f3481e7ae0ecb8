// POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
// {"lora_name"}, as vLLM serves them, when lora.runtime_updates is on. A load is checked here
// against the model (HttpServerOptions::check_lora: a bad adapter is the client's 400 and the
// workers never see it), then carried to every worker by the next step; the name is served,
// and the answer sent, once they all hold it. An unload stops serving the name and answers at
// once (new requests get 404); the workers drop the adapter once no running or waiting
// request uses it.
#include <chrono>
#include <future>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/logging.h"
#include "coordinator/server/http_session.h"

namespace tessera {
namespace {

// Long enough for any worker to read an adapter (or for the requests using one to finish).
constexpr auto kLoraUpdateWait = std::chrono::minutes(10);

struct LoraAnswer {
  int status = 200;
  std::string text;  // the 200's body (vLLM answers plain text)
  ApiError error;
};

LoraAnswer failed(ApiError e) {
  LoraAnswer a;
  a.status = e.http_status;
  a.error = std::move(e);
  return a;
}

// Waits for EngineService::load_lora / unload_lora's done.
Status wait_for(const std::function<void(std::function<void(Status)>)>& start) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> result = promise->get_future();
  start([promise](Status st) { promise->set_value(std::move(st)); });
  if (result.wait_for(kLoraUpdateWait) != std::future_status::ready)
    return Status(StatusCode::kUnavailable, "the workers did not answer within 10 minutes");
  return result.get();
}

}  // namespace

void HttpSession::update_lora(bool load, std::string body) {
  const char* route = load ? "/v1/load_lora_adapter" : "/v1/unload_lora_adapter";
  if (!server_.options.lora_runtime_updates) {
    return send_error(api_error(404, "invalid_request_error", "not_found",
                                std::string(route) + " is off: set lora.runtime_updates: true to load and unload "
                                                     "LoRA adapters while the server runs"));
  }
  off_io(body.size(), [this, load, route, body = std::move(body)]() -> LoraAnswer {
    const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return failed(bad_request("", std::string("the body of ") + route + " must be a JSON object"));
    for (const auto& [key, value] : j.items()) {
      if (key != "lora_name" && (key != "lora_path" || !load))
        return failed(bad_request(key, "'" + key + "' is not a field of " + route));
    }
    const auto name_it = j.find("lora_name");
    if (name_it == j.end() || !name_it->is_string() || !valid_lora_name(name_it->get<std::string>()))
      return failed(bad_request("lora_name", "'lora_name' must be 1 to 128 letters, digits and . _ - : /"));
    const std::string name = name_it->get<std::string>();
    ServedLoras& served = *server_.api.lora_adapters;
    EngineService& service = server_.service;
    LoraAnswer a;
    if (!load) {
      // Answered at once: the requests still using the adapter may run for minutes, and this
      // thread prepares other requests.
      if (!served.remove(name)) return failed(model_not_found(name, server_.api.served(), "lora_name"));
      service.unload_lora(name, [name, registry = server_.api.lora_adapters](const Status& st) {
        if (!st.is_ok()) TESSERA_LOG_WARN("[coord] dropping LoRA adapter {} failed: {}", name, st.to_string());
        registry->finish_unload(name);
      });
      a.text = "Success: LoRA adapter '" + name + "' removed successfully.";
      return a;
    }
    const auto path_it = j.find("lora_path");
    if (path_it == j.end() || !path_it->is_string() || path_it->get<std::string>().empty())
      return failed(bad_request("lora_path", "'lora_path' (the adapter's PEFT folder) is required"));
    const std::string dir = path_it->get<std::string>();
    if (name == server_.api.model_name || !served.reserve(name))
      return failed(bad_request("lora_name", "'" + name + "' is already served (or being loaded, or still being "
                                                          "unloaded: requests run with it)"));
    if (server_.options.check_lora) {
      if (Status st = server_.options.check_lora(name, dir); !st.is_ok()) {
        served.finish_load(name, dir, false);
        return failed(bad_request("lora_path", st.message()));
      }
    }
    const Status st = wait_for([&](auto done) { service.load_lora(name, dir, std::move(done)); });
    served.finish_load(name, dir, st.is_ok());
    if (!st.is_ok()) return failed(api_error(500, "internal_error", "lora_load_failed", st.message()));
    a.text = "Success: LoRA adapter '" + name + "' added successfully.";
    return a;
  }, [this](LoraAnswer a) {
    if (a.status != 200) return send_error(a.error);
    send(200, "text/plain; charset=utf-8", std::move(a.text));
  });
}

}  // namespace tessera
