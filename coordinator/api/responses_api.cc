#include "coordinator/api/responses_api.h"

#include <atomic>
#include <cstdio>
#include <random>
#include <set>

#include "coordinator/api/request_body.h"

namespace tessera {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// Fields read here; every other one is a 400 naming it.
const std::set<std::string>& responses_fields() {
  static const std::set<std::string> kFields = {
      "model",  "input",       "instructions", "max_output_tokens", "temperature", "top_p",    "tools",
      "tool_choice", "parallel_tool_calls", "text", "previous_response_id", "store", "stream", "metadata",
      "user",   "truncation",  "include",      "reasoning"};
  return kFields;
}

bool fail(ApiError* error, const std::string& param, const std::string& message) {
  *error = bad_request(param, message);
  return false;
}

// The text of a message's content: a string, or input_text / output_text parts.
bool content_text(const ojson& content, const std::string& param, std::string* out, ApiError* error) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (!content.is_array()) return fail(error, param, "'" + param + "' must be a string or an array of text parts");
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string where = param + "[" + std::to_string(i) + "]";
    const std::string type = part.is_object() && part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
    if (type != "input_text" && type != "output_text" && type != "text")
      return fail(error, where + ".type",
                  "'" + where + ".type' " + (type.empty() ? "is missing" : "'" + type + "' is not implemented") +
                      " (text parts only: input_text, output_text)");
    if (!part.contains("text") || !part["text"].is_string()) return fail(error, where + ".text", "'" + where + ".text' must be a string");
    *out += part["text"].get<std::string>();
  }
  return true;
}

bool string_field(const ojson& item, const char* key, const std::string& param, std::string* out, ApiError* error) {
  if (!item.contains(key) || !item[key].is_string())
    return fail(error, param + "." + key, "'" + param + "." + key + "' must be a string");
  *out = item[key].get<std::string>();
  return true;
}

// A reasoning item's thoughts: the texts of its reasoning_text content parts, joined ("" when
// it carries none, as an item from a service that sends only summaries or encrypted content).
bool reasoning_text(const ojson& item, const std::string& param, std::string* out, ApiError* error) {
  if (!item.contains("content") || item["content"].is_null()) return true;
  const ojson& content = item["content"];
  if (!content.is_array()) return fail(error, param + ".content", "'" + param + ".content' must be an array of reasoning_text parts");
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string where = param + ".content[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", ojson()) != "reasoning_text")
      return fail(error, where + ".type", "'" + where + ".type' must be \"reasoning_text\"");
    if (!part.contains("text") || !part["text"].is_string()) return fail(error, where + ".text", "'" + where + ".text' must be a string");
    *out += part["text"].get<std::string>();
  }
  return true;
}

// The input items as chat messages, appended to *messages: messages by role (developer is a
// system message), function_call items as an assistant message's tool_calls (consecutive ones
// together), function_call_output items as tool messages, and a reasoning item's thoughts as
// the reasoning_content of the assistant turn it precedes (an assistant message of its own when
// no assistant message or call follows it), as the chat API takes an earlier reply back.
bool input_messages(const ojson& input, ojson* messages, ApiError* error) {
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return true;
  }
  if (!input.is_array() || input.empty()) return fail(error, "input", "'input' must be a string or a non-empty array of items");
  std::string thoughts;  // a reasoning item's, until the assistant turn it belongs to
  auto flush_thoughts = [&] {
    if (!thoughts.empty()) messages->push_back({{"role", "assistant"}, {"content", ""}, {"reasoning_content", thoughts}});
    thoughts.clear();
  };
  auto assistant_turn = [&](ojson message) {
    if (!thoughts.empty()) message["reasoning_content"] = thoughts;
    thoughts.clear();
    messages->push_back(std::move(message));
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string param = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return fail(error, param, "'" + param + "' must be an object");
    const std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "message";
    if (type == "message") {
      std::string role, text;
      if (!string_field(item, "role", param, &role, error)) return false;
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        return fail(error, param + ".role", "'" + param + ".role' must be user, system, developer or assistant");
      if (!item.contains("content")) return fail(error, param + ".content", "'" + param + ".content' is required");
      if (!content_text(item["content"], param + ".content", &text, error)) return false;
      if (role == "assistant") {
        assistant_turn({{"role", "assistant"}, {"content", text}});
      } else {
        flush_thoughts();
        messages->push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
      }
    } else if (type == "function_call") {
      std::string call_id, name, arguments;
      if (!string_field(item, "call_id", param, &call_id, error) || !string_field(item, "name", param, &name, error) ||
          !string_field(item, "arguments", param, &arguments, error))
        return false;
      const ojson call = {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
      ojson& last = messages->empty() ? *messages : messages->back();
      if (thoughts.empty() && !messages->empty() && last["role"] == "assistant" && last.contains("tool_calls")) {
        last["tool_calls"].push_back(call);
      } else {
        assistant_turn({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
      }
    } else if (type == "function_call_output") {
      std::string call_id, output;
      if (!string_field(item, "call_id", param, &call_id, error)) return false;
      if (!item.contains("output")) return fail(error, param + ".output", "'" + param + ".output' is required");
      if (!content_text(item["output"], param + ".output", &output, error)) return false;
      flush_thoughts();
      messages->push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
    } else if (type == "reasoning") {
      if (!reasoning_text(item, param, &thoughts, error)) return false;
    } else {
      return fail(error, param + ".type", "'" + param + ".type' '" + type + "' is not implemented (message, "
                                          "function_call, function_call_output, reasoning)");
    }
  }
  flush_thoughts();
  return true;
}

// Function tools ({"type": "function", "name", "description", "parameters", "strict"}) as chat tools.
bool chat_tools(const ojson& tools, ojson* out, ApiError* error) {
  if (!tools.is_array()) return fail(error, "tools", "'tools' must be an array");
  *out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    const std::string type = t.is_object() && t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "";
    if (type != "function")
      return fail(error, param + ".type", "'" + param + ".type' " + (type.empty() ? "is missing" : "'" + type + "' is not implemented") +
                                              " (function tools only)");
    ojson function = {{"name", t.value("name", ojson())}};
    for (const char* key : {"description", "parameters", "strict"})
      if (t.contains(key) && !t[key].is_null()) function[key] = t[key];
    out->push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return true;
}

bool chat_tool_choice(const ojson& choice, ojson* out, ApiError* error) {
  if (choice.is_string()) {
    *out = choice;
    return true;
  }
  if (choice.is_object() && choice.value("type", "") == "function" && choice.contains("name")) {
    *out = {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
    return true;
  }
  return fail(error, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
}

// text.format as response_format.
bool response_format(const ojson& text, ojson* out, ApiError* error) {
  if (!text.is_object()) return fail(error, "text", "'text' must be an object");
  for (const auto& [key, value] : text.items())
    if (key != "format" && !(key == "verbosity" && value.is_null()))
      return fail(error, "text." + key, "'text." + key + "' is not implemented");
  if (!text.contains("format") || text["format"].is_null()) return true;
  const ojson& f = text["format"];
  const std::string type = f.is_object() ? f.value("type", "") : "";
  if (type == "text") return true;
  if (type == "json_object") {
    *out = {{"type", "json_object"}};
    return true;
  }
  if (type == "json_schema") {
    ojson schema = {{"name", f.value("name", "response")}};
    if (f.contains("schema")) schema["schema"] = f["schema"];
    if (f.contains("strict")) schema["strict"] = f["strict"];
    *out = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
    return true;
  }
  return fail(error, "text.format.type", "'text.format.type' must be text, json_object or json_schema");
}

// Fields accepted only at the value that changes nothing.
bool no_op_fields(const ojson& j, ApiError* error) {
  if (j.contains("truncation") && !j["truncation"].is_null() && j["truncation"] != "disabled")
    return fail(error, "truncation", "'truncation' \"auto\" is not implemented (an over-long input is a 400)");
  if (j.contains("include") && !j["include"].is_null() && !(j["include"].is_array() && j["include"].empty()))
    return fail(error, "include", "'include' is not implemented");
  if (j.contains("reasoning") && !j["reasoning"].is_null()) {
    const ojson& r = j["reasoning"];
    if (!r.is_object()) return fail(error, "reasoning", "'reasoning' must be an object {\"effort\": ...}");
    for (const auto& [key, value] : r.items()) {
      if (key == "effort" || value.is_null()) continue;
      return fail(error, "reasoning." + key,
                  "'reasoning." + key + "' is not implemented (only effort; a reasoning model's thoughts come whole "
                  "as a reasoning output item)");
    }
  }
  return true;
}

std::string random_hex(size_t digits) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) << 32));
  std::string out;
  while (out.size() < digits) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
    out += buf;
  }
  out.resize(digits);
  return out;
}

// An output item's id: its kind's prefix, the response's id and its place in the output, so
// the streamed items and the final response name them alike.
std::string item_id(const char* prefix, const std::string& response_id, int index) {
  return std::string(prefix) + response_id.substr(response_id.find('_') + 1) + "_" + std::to_string(index);
}

ojson message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", ojson::array({{{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}}})}};
}

ojson reasoning_item(const std::string& id, const std::string& text) {
  return {{"type", "reasoning"},
          {"id", id},
          {"summary", ojson::array()},
          {"content", ojson::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

}  // namespace

void ResponseStore::expire(std::chrono::steady_clock::time_point now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = now - it->second.at > max_age_ ? entries_.erase(it) : std::next(it);
  }
  while (entries_.size() > max_count_) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.order < oldest->second.order) oldest = it;
    entries_.erase(oldest);
  }
}

void ResponseStore::put(const std::string& id, Stored stored) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  entries_[id] = Entry{std::move(stored), now, next_order_++};
  expire(now);
}

std::optional<ResponseStore::Stored> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  expire(std::chrono::steady_clock::now());
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.stored;
}

std::string make_responses_id() { return "resp_" + random_hex(32); }

bool parse_responses_request(std::string_view body, const ServedModels& served, ResponseStore& store,
                             ResponsesRequest* out, ApiError* error) {
  *out = ResponsesRequest();
  ojson j;
  if (!read_request_object(body, responses_fields(), "/v1/responses", served, &j, error)) return false;
  if (!no_op_fields(j, error)) return false;
  if (!j.contains("input") || j["input"].is_null()) return fail(error, "input", "'input' is required");

  ojson& chat = out->chat_body;
  chat = ojson::object();
  ojson& echo = out->echo;
  echo = {{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"temperature", nullptr}, {"top_p", nullptr},
          {"tools", ojson::array()}, {"tool_choice", "auto"}, {"parallel_tool_calls", true},
          {"previous_response_id", nullptr}, {"store", true}, {"text", {{"format", {{"type", "text"}}}}},
          {"metadata", ojson::object()}, {"user", nullptr}};
  if (j.contains("model")) chat["model"] = j["model"];
  // The stored conversation first, then this request's input.
  out->messages = ojson::array();
  if (j.contains("previous_response_id") && !j["previous_response_id"].is_null()) {
    if (!j["previous_response_id"].is_string()) return fail(error, "previous_response_id", "'previous_response_id' must be a string");
    const std::string previous = j["previous_response_id"].get<std::string>();
    std::optional<ResponseStore::Stored> stored = store.get(previous);
    if (!stored) {
      *error = bad_request("previous_response_id", "no stored response '" + previous +
                                                       "' (unknown, stored with store: false, or expired)");
      error->http_status = 404;
      error->code = "previous_response_not_found";
      return false;
    }
    out->messages = stored->messages;
    echo["previous_response_id"] = previous;
  }
  if (!input_messages(j["input"], &out->messages, error)) return false;
  chat["messages"] = ojson::array();
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) return fail(error, "instructions", "'instructions' must be a string");
    chat["messages"].push_back({{"role", "system"}, {"content", j["instructions"]}});
    echo["instructions"] = j["instructions"];
  }
  for (const ojson& m : out->messages) chat["messages"].push_back(m);
  // Sampling and length: the chat fields of the same meaning (chat checks the values).
  const std::pair<const char*, const char*> renamed[] = {{"max_output_tokens", "max_completion_tokens"},
                                                         {"temperature", "temperature"},
                                                         {"top_p", "top_p"},
                                                         {"parallel_tool_calls", "parallel_tool_calls"},
                                                         {"user", "user"}};
  // reasoning.effort is chat's reasoning_effort: the chat template's variable.
  if (j.contains("reasoning") && j["reasoning"].is_object() && j["reasoning"].contains("effort") &&
      !j["reasoning"]["effort"].is_null()) {
    chat["reasoning_effort"] = j["reasoning"]["effort"];
    echo["reasoning"] = {{"effort", j["reasoning"]["effort"]}, {"summary", nullptr}};
  }
  for (const auto& [from, to] : renamed) {
    if (!j.contains(from) || j[from].is_null()) continue;
    chat[to] = j[from];
    echo[from] = j[from];
  }
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!chat_tools(j["tools"], &chat["tools"], error)) return false;
    echo["tools"] = j["tools"];
  }
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    if (!chat_tool_choice(j["tool_choice"], &chat["tool_choice"], error)) return false;
    echo["tool_choice"] = j["tool_choice"];
  }
  if (j.contains("text") && !j["text"].is_null()) {
    ojson format;
    if (!response_format(j["text"], &format, error)) return false;
    if (!format.is_null()) chat["response_format"] = std::move(format);
    echo["text"] = j["text"];
  }
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    if (!j["metadata"].is_object()) return fail(error, "metadata", "'metadata' must be an object");
    echo["metadata"] = j["metadata"];
  }
  for (const auto& [key, field] : {std::pair<const char*, bool*>{"store", &out->store}, {"stream", &out->stream}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_boolean()) return fail(error, key, std::string("'") + key + "' must be a boolean");
    *field = j[key].get<bool>();
  }
  echo["store"] = out->store;
  if (out->stream) chat["stream"] = true;
  return true;
}

ojson responses_object(const json& chat, const std::string& id, int64_t created_at, const ResponsesRequest& request) {
  const json& choice = chat["choices"][0];
  const json& message = choice["message"];
  const bool cut = choice["finish_reason"] == "length";
  ojson output = ojson::array();
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    output.push_back(reasoning_item(item_id("rs_", id, static_cast<int>(output.size())), message["reasoning_content"]));
  const bool calls = message.contains("tool_calls") && message["tool_calls"].is_array() && !message["tool_calls"].empty();
  const std::string text = message["content"].is_string() ? message["content"].get<std::string>() : "";
  // An output cut inside the thoughts has no answer (content null): no message item, the
  // reasoning item and status incomplete say so.
  const bool answered = !message["content"].is_null() || !message.contains("reasoning_content");
  if (answered && (!text.empty() || !calls))
    output.push_back(message_item(item_id("msg_", id, static_cast<int>(output.size())), text, cut ? "incomplete" : "completed"));
  if (calls) {
    for (const json& c : message["tool_calls"]) {
      output.push_back({{"type", "function_call"},
                        {"id", item_id("fc_", id, static_cast<int>(output.size()))},
                        {"call_id", c["id"]},
                        {"name", c["function"]["name"]},
                        {"arguments", c["function"]["arguments"]},
                        {"status", "completed"}});
    }
  }
  const json& usage = chat["usage"];
  ojson r = {{"id", id},
             {"object", "response"},
             {"created_at", created_at},
             {"status", cut ? "incomplete" : "completed"},
             {"error", nullptr},
             {"incomplete_details", cut ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr)},
             {"model", chat["model"]},
             {"output", std::move(output)}};
  for (const auto& [key, value] : request.echo.items()) r[key] = value;
  r["usage"] = {{"input_tokens", usage["prompt_tokens"]},
                {"input_tokens_details", {{"cached_tokens", 0}}},
                {"output_tokens", usage["completion_tokens"]},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", usage["total_tokens"]}};
  return r;
}

ojson conversation_after(const ResponsesRequest& request, const json& chat) {
  ojson messages = request.messages;
  const json& message = chat["choices"][0]["message"];
  ojson answer = {{"role", "assistant"}, {"content", message["content"].is_string() ? message["content"] : json("")}};
  // The thoughts stay with the turn, as a reasoning item given back in `input` would.
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    answer["reasoning_content"] = message["reasoning_content"];
  if (message.contains("tool_calls")) answer["tool_calls"] = message["tool_calls"];
  messages.push_back(std::move(answer));
  return messages;
}

ResponsesStream::ResponsesStream(std::string id, int64_t created_at, const ResponsesRequest& request)
    : id_(std::move(id)), created_at_(created_at), echo_(request.echo) {}

ojson ResponsesStream::shell(const char* status) const {
  ojson r = {{"id", id_},   {"object", "response"},      {"created_at", created_at_}, {"status", status},
             {"error", nullptr}, {"incomplete_details", nullptr}, {"output", ojson::array()}};
  for (const auto& [key, value] : echo_.items()) r[key] = value;
  r["usage"] = nullptr;
  return r;
}

ResponsesStream::Event ResponsesStream::event(const std::string& type, ojson data) {
  ojson e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : data.items()) e[key] = std::move(value);
  return {type, e.dump(-1, ' ', false, json::error_handler_t::replace)};
}

std::vector<ResponsesStream::Event> ResponsesStream::start() {
  return {event("response.created", {{"response", shell("in_progress")}}),
          event("response.in_progress", {{"response", shell("in_progress")}})};
}

void ResponsesStream::open(Open kind, std::vector<Event>& out, const json& call) {
  close(out);
  ++output_index_;
  open_ = kind;
  text_.clear();
  ojson item;
  if (kind == Open::kReasoning) {
    item_id_ = item_id("rs_", id_, output_index_);
    item = {{"type", "reasoning"}, {"id", item_id_}, {"summary", ojson::array()}, {"content", ojson::array()}};
  } else if (kind == Open::kMessage) {
    item_id_ = item_id("msg_", id_, output_index_);
    item = {{"type", "message"}, {"id", item_id_}, {"status", "in_progress"}, {"role", "assistant"}, {"content", ojson::array()}};
  } else {
    item_id_ = item_id("fc_", id_, output_index_);
    call_ = {{"type", "function_call"}, {"id", item_id_}, {"call_id", call.value("id", "")},
             {"name", call.contains("function") ? call["function"].value("name", "") : ""},
             {"arguments", ""}, {"status", "in_progress"}};
    item = call_;
  }
  out.push_back(event("response.output_item.added", {{"output_index", output_index_}, {"item", item}}));
  if (kind == Open::kMessage) {
    out.push_back(event("response.content_part.added",
                        {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0},
                         {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}}));
  }
}

void ResponsesStream::close(std::vector<Event>& out) {
  const ojson where = {{"item_id", item_id_}, {"output_index", output_index_}};
  if (open_ == Open::kReasoning) {
    ojson done = where;
    done["content_index"] = 0;
    done["text"] = text_;
    out.push_back(event("response.reasoning_text.done", std::move(done)));
    out.push_back(event("response.output_item.done",
                        {{"output_index", output_index_}, {"item", reasoning_item(item_id_, text_)}}));
  } else if (open_ == Open::kMessage) {
    ojson done = where;
    done["content_index"] = 0;
    done["text"] = text_;
    out.push_back(event("response.output_text.done", done));
    done.erase("text");
    done["part"] = {{"type", "output_text"}, {"text", text_}, {"annotations", ojson::array()}};
    out.push_back(event("response.content_part.done", std::move(done)));
    out.push_back(event("response.output_item.done",
                        {{"output_index", output_index_}, {"item", message_item(item_id_, text_, "completed")}}));
  } else if (open_ == Open::kCall) {
    ojson done = where;
    done["arguments"] = call_["arguments"];
    out.push_back(event("response.function_call_arguments.done", std::move(done)));
    call_["status"] = "completed";
    out.push_back(event("response.output_item.done", {{"output_index", output_index_}, {"item", call_}}));
  }
  open_ = Open::kNone;
}

std::vector<ResponsesStream::Event> ResponsesStream::feed(const json& chunk) {
  std::vector<Event> out;
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return out;
  const json& delta = chunk["choices"][0].value("delta", json::object());
  auto text_delta = [&](const char* type, const std::string& text) {
    text_ += text;
    out.push_back(event(type, {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"delta", text}}));
  };
  if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string() &&
      !delta["reasoning_content"].get<std::string>().empty()) {
    if (open_ != Open::kReasoning) open(Open::kReasoning, out);
    text_delta("response.reasoning_text.delta", delta["reasoning_content"]);
  }
  if (delta.contains("content") && delta["content"].is_string() && !delta["content"].get<std::string>().empty()) {
    if (open_ != Open::kMessage) open(Open::kMessage, out);
    text_delta("response.output_text.delta", delta["content"]);
  }
  if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
    for (const json& call : delta["tool_calls"]) {
      if (call.contains("id")) open(Open::kCall, out, call);  // a call's first delta
      if (open_ != Open::kCall || !call.contains("function")) continue;
      const std::string args = call["function"].value("arguments", "");
      if (args.empty()) continue;
      call_["arguments"] = call_["arguments"].get<std::string>() + args;
      out.push_back(event("response.function_call_arguments.delta",
                          {{"item_id", item_id_}, {"output_index", output_index_}, {"delta", args}}));
    }
  }
  return out;
}

std::vector<ResponsesStream::Event> ResponsesStream::finish(const ojson& final_response) {
  std::vector<Event> out;
  close(out);
  const bool incomplete = final_response.value("status", "") == "incomplete";
  out.push_back(event(incomplete ? "response.incomplete" : "response.completed", {{"response", final_response}}));
  return out;
}

ResponsesStream::Event ResponsesStream::error(const ApiError& e) {
  return event("error", {{"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)},
                         {"message", e.message},
                         {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)}});
}

std::string responses_sse_event(const ResponsesStream::Event& e) {
  return "event: " + e.first + "\ndata: " + e.second + "\n\n";
}

}  // namespace tessera
