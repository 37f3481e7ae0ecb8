#include "tools/loadgen/openai_request.h"

#include <nlohmann/json.hpp>

namespace tessera::loadgen {

using nlohmann::json;

std::string request_json(const RequestSpec& spec, const RequestFormat& format, bool http_stream) {
  json body = json::object();
  if (!format.model.empty()) body["model"] = format.model;
  if (format.embeddings) {
    if (spec.prompt_ids.empty()) {
      body["input"] = spec.prompt_text;
    } else {
      body["input"] = spec.prompt_ids;
    }
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (format.responses) {
    body["input"] = spec.prompt_text;
    body["max_output_tokens"] = spec.output_len;
    if (format.temperature) body["temperature"] = *format.temperature;
    if (http_stream) body["stream"] = true;
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (format.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", spec.prompt_text}}});
  } else if (!spec.prompt_ids.empty()) {
    body["prompt"] = spec.prompt_ids;
  } else {
    body["prompt"] = spec.prompt_text;
  }
  body["max_tokens"] = spec.output_len;
  if (format.ignore_eos) body["ignore_eos"] = true;
  if (format.temperature) body["temperature"] = *format.temperature;
  if (format.logprobs) {
    if (format.chat) {
      body["logprobs"] = true;
    } else {
      body["logprobs"] = 0;
    }
  }
  if (http_stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

StreamChunk parse_stream_chunk(std::string_view payload, bool chat) {
  StreamChunk out;
  const json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  out.valid = true;
  if (const auto e = j.find("error"); e != j.end() && !e->is_null()) {
    const std::string message = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                                    ? (*e)["message"].get<std::string>()
                                    : e->dump();
    out.error = message;
    return out;
  }
  if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (const auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) out.prompt_tokens = p->get<int>();
    if (const auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer()) {
      out.completion_tokens = c->get<int>();
    }
  }
  const auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array()) return out;
  for (const json& choice : *choices) {
    if (!choice.is_object()) continue;
    int logprob_tokens = -1;
    if (const auto lp = choice.find("logprobs"); lp != choice.end() && lp->is_object()) {
      const auto list = lp->find(chat ? "content" : "tokens");
      if (list != lp->end() && list->is_array()) logprob_tokens = static_cast<int>(list->size());
    }
    std::string text;
    if (chat) {
      if (const auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        if (const auto c = d->find("content"); c != d->end() && c->is_string()) text = c->get<std::string>();
      }
    } else if (const auto t = choice.find("text"); t != choice.end() && t->is_string()) {
      text = t->get<std::string>();
    }
    out.tokens += logprob_tokens >= 0 ? logprob_tokens : (text.empty() ? 0 : 1);
    if (const auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) {
      out.finished = true;
      out.finish_reason = f->get<std::string>();
    }
  }
  return out;
}

StreamChunk parse_responses_event(std::string_view payload) {
  StreamChunk out;
  const json j = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  out.valid = true;
  const std::string type = j.value("type", "");
  if (type == "error") {
    out.error = j.contains("message") && j["message"].is_string() ? j["message"].get<std::string>() : j.dump();
  } else if (type == "response.output_text.delta") {
    out.tokens = 1;
  } else if (type == "response.completed" || type == "response.incomplete") {
    out.finished = true;
    out.finish_reason = type == "response.completed" ? "stop" : "length";
    const json& response = j.contains("response") && j["response"].is_object() ? j["response"] : json::object();
    if (const auto u = response.find("usage"); u != response.end() && u->is_object()) {
      if (const auto i = u->find("input_tokens"); i != u->end() && i->is_number_integer()) out.prompt_tokens = i->get<int>();
      if (const auto o = u->find("output_tokens"); o != u->end() && o->is_number_integer()) out.completion_tokens = o->get<int>();
    }
  }
  return out;
}

}  // namespace tessera::loadgen
