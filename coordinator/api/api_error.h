#pragma once
// The errors of the OpenAI layer, in OpenAI's shape, apart from the rest of the API so that
// the server layer (coordinator/server/http_edges.h) and the request readers can name them
// without the whole request/response layer.
#include <map>
#include <string>

namespace tessera {

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} plus the
// HTTP status it travels with.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field ("temperature", "messages[1].content"); "" = null
  std::string code;   // "" = null
};

std::string error_body(const ApiError& error);
ApiError bad_request(std::string param, std::string message);
// A 500 server_error / internal_error: the server cannot serve the request (no usable chat
// template).
ApiError api_server_error(std::string message);
// What a request's "model" may name: the base model, or a LoRA adapter served beside it.
struct ServedModels {
  std::string base;
  std::map<std::string, std::string> adapters;  // name -> its PEFT folder (lora.adapters)
  // Whether `asked` names something served ("" = the base); `adapter` gets the adapter's
  // name, or "" for the base.
  bool find(const std::string& asked, std::string* adapter) const;
};

// A 404 model_not_found: the request's "model" (param `param`) names nothing this server serves.
ApiError model_not_found(const std::string& asked, const ServedModels& served, std::string param = "model");

}  // namespace tessera
