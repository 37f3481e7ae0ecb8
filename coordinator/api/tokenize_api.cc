#include "coordinator/api/tokenize_api.h"

#include <nlohmann/json.hpp>

#include <set>

#include "coordinator/api/chat_request.h"
#include "coordinator/api/request_body.h"
#include "coordinator/api/response_json.h"

namespace tessera {
namespace {

using nlohmann::json;

ApiError not_found_model(const ApiContext& ctx, const std::string& model, const std::string& param) {
  return model_not_found(model, ctx.served(), param);
}

// The body of `route` as read_request_object reads it, unordered.
bool read_object(const ApiContext& ctx, const std::string& body, const std::set<std::string>& known,
                 const std::string& route, json* out, ApiError* error) {
  nlohmann::ordered_json ordered;
  if (!read_request_object(body, known, route, ctx.served(), &ordered, error)) return false;
  *out = ordered;
  return true;
}

// An optional boolean field (null = absent).
bool read_bool(const json& j, const char* name, bool* out, ApiError* error) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    *error = bad_request(name, std::string("'") + name + "' must be a boolean");
    return false;
  }
  *out = it->get<bool>();
  return true;
}

}  // namespace

bool tokenize_body(const ApiContext& ctx, const std::string& body, std::string* out, ApiError* error) {
  json j;
  if (!read_object(ctx, body, {"model", "prompt", "messages", "tools", "add_special_tokens", "add_generation_prompt",
                               "continue_final_message", "chat_template_kwargs", "return_token_strs"},
                   "/tokenize", &j, error))
    return false;
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  const bool has_messages = j.contains("messages") && !j["messages"].is_null();
  if (has_prompt == has_messages) {
    *error = bad_request(has_prompt ? "messages" : "prompt", "give exactly one of 'prompt' and 'messages'");
    return false;
  }
  if (ctx.tokenizer == nullptr) {
    *error = bad_request(has_prompt ? "prompt" : "messages", "this server has no tokenizer: /tokenize is unavailable");
    return false;
  }
  bool return_strs = false;
  if (!read_bool(j, "return_token_strs", &return_strs, error)) return false;
  std::vector<int32_t> ids;
  if (has_prompt) {
    if (!j["prompt"].is_string()) {
      *error = bad_request("prompt", "'prompt' must be a string");
      return false;
    }
    for (const char* chat_only : {"add_generation_prompt", "continue_final_message", "chat_template_kwargs"}) {
      if (j.contains(chat_only)) {
        *error = bad_request(chat_only, std::string("'") + chat_only + "' applies to 'messages' only");
        return false;
      }
    }
    bool special = true;  // vLLM's default for a prompt
    if (!read_bool(j, "add_special_tokens", &special, error)) return false;
    ids = ctx.tokenizer->encode(j["prompt"].get<std::string>(), special);
  } else {
    if (j.contains("tools") && !j["tools"].is_null() && has_prompt) {
      *error = bad_request("tools", "'tools' applies to 'messages' only");
      return false;
    }
    // As chat completions read them (coordinator/api/chat_request.h), key order kept.
    ChatRequestParts parts;
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body, nullptr, false);
    if (!read_chat_messages_and_tools(ordered, &parts, error)) return false;
    if (!read_generation_prompt_fields(ordered, &parts, error)) return false;
    // The template carries BOS itself, so vLLM's default adds no special tokens.
    bool special = false;
    if (!read_bool(j, "add_special_tokens", &special, error)) return false;
    if (!ctx.chat_renderer) {
      *error = api_server_error("this server has no chat template: /tokenize cannot render 'messages'");
      return false;
    }
    StatusOr<std::string> rendered = ctx.chat_renderer(parts.context);
    if (!rendered.is_ok()) {
      *error = chat_render_error(rendered.status());
      return false;
    }
    if (parts.continue_final_message && !cut_after_final_message(parts.context, &rendered.value(), error)) return false;
    const std::string text = std::move(rendered).value();
    ids = ctx.tokenizer->encode(text, special);
  }
  json r = {{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (return_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(ctx.tokenizer->id_to_token(id));
    r["token_strs"] = std::move(strs);
  }
  *out = response_json(r);
  return true;
}

bool detokenize_body(const ApiContext& ctx, const std::string& body, std::string* out, ApiError* error) {
  json j;
  if (!read_object(ctx, body, {"model", "tokens"}, "/detokenize", &j, error)) return false;
  if (!j.contains("tokens") || !j["tokens"].is_array()) {
    *error = bad_request("tokens", "'tokens' must be an array of token ids");
    return false;
  }
  if (ctx.tokenizer == nullptr) {
    *error = bad_request("tokens", "this server has no tokenizer: /detokenize is unavailable");
    return false;
  }
  std::vector<int32_t> ids;
  const int64_t vocab = ctx.tokenizer->vocab_size();
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    const json& t = j["tokens"][i];
    const std::string at = "tokens[" + std::to_string(i) + "]";
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      *error = bad_request(at, "'" + at + "' must be a token id in [0, " + std::to_string(vocab) + ")");
      return false;
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  // As vLLM decodes: special tokens are kept (skip_special_tokens would hide BOS/EOS).
  *out = response_json(json{{"prompt", ctx.tokenizer->decode(ids, false)}});
  return true;
}

bool model_card_body(const ApiContext& ctx, const std::string& id, int64_t created, std::string* out,
                     ApiError* error) {
  std::string adapter;
  const ServedModels served = ctx.served();
  if (!served.find(id, &adapter) || id.empty()) {
    *error = not_found_model(ctx, id, "model");
    return false;
  }
  *out = model_card(ctx.model_name, ctx.max_model_len, created, adapter,
                    adapter.empty() ? "" : served.adapters.at(adapter))
             .dump();
  return true;
}

}  // namespace tessera
