#include "coordinator/api/chat_request.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <set>
#include <string_view>

namespace tessera {
namespace {

using ojson = nlohmann::ordered_json;

// Fails with a 400 naming `param`; the message starts with the field's name in quotes.
bool fail(ApiError* error, const std::string& param, const std::string& what) {
  *error = bad_request(param, "'" + param + "' " + what);
  return false;
}

// Refuses any key of `object` outside `known` whose value is not null, naming it (null
// means absent, as for the body's fields: clients echo an answer's message back with
// "refusal": null and the like).
bool only_keys(const ojson& object, const std::string& at, std::initializer_list<std::string_view> known,
               ApiError* error) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it->is_null()) continue;
    bool ok = false;
    for (std::string_view k : known) ok = ok || it.key() == k;
    if (!ok) {
      const std::string param = at + "." + it.key();
      *error = bad_request(param, "unknown field '" + param + "' (docs/api.md lists the message and tool fields)");
      return false;
    }
  }
  return true;
}

const ojson* find_present(const ojson& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// Content as a string, or a list of text parts joined with no separator (what the
// fixtures' reference renders when a template cannot take a list).
bool read_content(const ojson& content, const std::string& at, std::string* out, ApiError* error) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (!content.is_array()) return fail(error, at, "must be a string or an array of text parts");
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& part = content[k];
    const std::string pat = at + "[" + std::to_string(k) + "]";
    if (!part.is_object()) return fail(error, pat, "must be a {\"type\": \"text\", \"text\": ...} part");
    const ojson* type = find_present(part, "type");
    if (type == nullptr || !type->is_string()) return fail(error, pat + ".type", "must be a string (\"text\")");
    const std::string t = type->get<std::string>();
    if (t == "image_url" || t == "input_audio" || t == "file" || t == "image" || t == "audio" || t == "video")
      return fail(error, pat, "is a '" + t + "' part: this server's model takes text only");
    if (t != "text") return fail(error, pat + ".type", "must be \"text\" (got \"" + t + "\")");
    if (!only_keys(part, pat, {"type", "text"}, error)) return false;
    const ojson* text = find_present(part, "text");
    if (text == nullptr || !text->is_string()) return fail(error, pat + ".text", "must be a string");
    *out += text->get<std::string>();
  }
  return true;
}

// One entry of an assistant message's tool_calls, as the template gets it.
bool read_tool_call(const ojson& call, const std::string& at, ojson* out, ApiError* error) {
  if (!call.is_object()) return fail(error, at, "must be an object {id, type, function}");
  if (!only_keys(call, at, {"id", "type", "function", "index"}, error)) return false;
  const ojson* id = find_present(call, "id");
  if (id == nullptr || !id->is_string()) return fail(error, at + ".id", "must be a string");
  if (const ojson* type = find_present(call, "type"); type != nullptr && *type != "function")
    return fail(error, at + ".type", "must be \"function\"");
  const ojson* fn = find_present(call, "function");
  if (fn == nullptr || !fn->is_object()) return fail(error, at + ".function", "must be an object {name, arguments}");
  const std::string fat = at + ".function";
  if (!only_keys(*fn, fat, {"name", "arguments"}, error)) return false;
  const ojson* name = find_present(*fn, "name");
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty())
    return fail(error, fat + ".name", "must be a non-empty string");
  ojson args = ojson::object();
  if (const ojson* a = find_present(*fn, "arguments"); a != nullptr) {
    if (a->is_string()) {
      // OpenAI sends the arguments as JSON text; templates print them with tojson, so they
      // get the object it encodes (as transformers and vLLM pass it).
      const std::string& text = a->get_ref<const std::string&>();
      args = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded()) return fail(error, fat + ".arguments", "is not valid JSON text");
    } else {
      args = *a;
    }
    if (!args.is_object()) return fail(error, fat + ".arguments", "must encode a JSON object");
  }
  *out = ojson::object();
  (*out)["id"] = *id;
  (*out)["type"] = "function";
  (*out)["function"] = ojson::object();
  (*out)["function"]["name"] = *name;
  (*out)["function"]["arguments"] = std::move(args);
  return true;
}

bool read_message(const ojson& m, const std::string& at, ojson* out, ApiError* error) {
  if (!m.is_object()) return fail(error, at, "must be an object");
  const ojson* role = find_present(m, "role");
  if (role == nullptr || !role->is_string()) return fail(error, at + ".role", "must be a string");
  std::string r = role->get<std::string>();
  if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool")
    return fail(error, at + ".role", "must be one of system, developer, user, assistant, tool");
  if (!only_keys(m, at, {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning", "thinking"},
                 error))
    return false;
  if (r == "developer") r = "system";
  *out = ojson::object();
  (*out)["role"] = r;

  auto content = m.find("content");
  const bool has_content = content != m.end() && !content->is_null();
  const ojson* calls = find_present(m, "tool_calls");
  if (has_content) {
    std::string text;
    if (!read_content(*content, at + ".content", &text, error)) return false;
    (*out)["content"] = std::move(text);
  } else if (r != "assistant") {
    return fail(error, at + ".content", "is required");
  } else if (content != m.end()) {
    (*out)["content"] = nullptr;  // as sent: an assistant turn that only calls tools
  }
  if (const ojson* name = find_present(m, "name"); name != nullptr) {
    if (!name->is_string()) return fail(error, at + ".name", "must be a string");
    (*out)["name"] = *name;
  }
  if (calls != nullptr) {
    if (r != "assistant") return fail(error, at + ".tool_calls", "is allowed on assistant messages only");
    if (!calls->is_array()) return fail(error, at + ".tool_calls", "must be an array of tool calls");
    ojson list = ojson::array();
    for (size_t j = 0; j < calls->size(); ++j) {
      ojson call;
      if (!read_tool_call((*calls)[j], at + ".tool_calls[" + std::to_string(j) + "]", &call, error)) return false;
      list.push_back(std::move(call));
    }
    (*out)["tool_calls"] = std::move(list);
  }
  // An earlier answer's thoughts, as a reasoning model's reply gave them (reasoning_content) or
  // under the names other templates read (reasoning; thinking: gpt-oss's): passed on as sent,
  // for the template to render or drop (Qwen3's keeps those after the last user turn).
  for (const char* key : {"reasoning_content", "reasoning", "thinking"}) {
    const ojson* thoughts = find_present(m, key);
    if (thoughts == nullptr) continue;
    if (r != "assistant") return fail(error, at + "." + key, "is allowed on assistant messages only");
    if (!thoughts->is_string()) return fail(error, at + "." + key, "must be a string");
    (*out)[key] = *thoughts;
  }
  const ojson* call_id = find_present(m, "tool_call_id");
  if (r == "tool") {
    if (call_id == nullptr || !call_id->is_string())
      return fail(error, at + ".tool_call_id", "is required on a tool message (a string: the id of the call it answers)");
    (*out)["tool_call_id"] = *call_id;
  } else if (call_id != nullptr) {
    return fail(error, at + ".tool_call_id", "is allowed on tool messages only");
  }
  return true;
}

bool read_messages(const ojson& body, ojson* out, ApiError* error) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return fail(error, "messages", "is required");
  if (!it->is_array() || it->empty()) return fail(error, "messages", "must be a non-empty array of messages");
  *out = ojson::array();
  for (size_t i = 0; i < it->size(); ++i) {
    ojson m;
    if (!read_message((*it)[i], "messages[" + std::to_string(i) + "]", &m, error)) return false;
    out->push_back(std::move(m));
  }
  return true;
}

// "tools": [{"type": "function", "function": {name, description?, parameters?, strict?}}],
// passed to the template as sent. Names must be unique (a call names its function).
bool read_tools(const ojson& body, ojson* out, int* strict_tool, ApiError* error) {
  *out = nullptr;
  *strict_tool = -1;
  const ojson* tools = find_present(body, "tools");
  if (tools == nullptr) return true;
  if (!tools->is_array()) return fail(error, "tools", "must be an array of {\"type\": \"function\", \"function\": ...}");
  if (tools->empty()) return true;  // no tools: the template gets none (null), as without the field
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return fail(error, at, "must be an object {\"type\": \"function\", \"function\": ...}");
    if (!only_keys(t, at, {"type", "function"}, error)) return false;
    const ojson* type = find_present(t, "type");
    if (type == nullptr || *type != "function") return fail(error, at + ".type", "must be \"function\"");
    const ojson* fn = find_present(t, "function");
    if (fn == nullptr || !fn->is_object()) return fail(error, at + ".function", "must be an object");
    const std::string fat = at + ".function";
    if (!only_keys(*fn, fat, {"name", "description", "parameters", "strict"}, error)) return false;
    const ojson* name = find_present(*fn, "name");
    if (name == nullptr || !name->is_string() || name->get<std::string>().empty())
      return fail(error, fat + ".name", "must be a non-empty string");
    if (!names.insert(name->get<std::string>()).second)
      return fail(error, fat + ".name", "repeats the name '" + name->get<std::string>() + "' of an earlier tool");
    if (const ojson* d = find_present(*fn, "description"); d != nullptr && !d->is_string())
      return fail(error, fat + ".description", "must be a string");
    if (const ojson* p = find_present(*fn, "parameters"); p != nullptr && !p->is_object())
      return fail(error, fat + ".parameters", "must be a JSON Schema object");
    if (const ojson* s = find_present(*fn, "strict"); s != nullptr) {
      if (!s->is_boolean()) return fail(error, fat + ".strict", "must be a boolean");
      // Kept by the caller: a strict function's calls are decoded under its schema, forced or
      // not (openai_request.cc).
      if (s->get<bool>() && *strict_tool < 0) *strict_tool = static_cast<int>(i);
    }
  }
  *out = *tools;
  return true;
}

bool read_tool_choice(const ojson& body, bool has_tools, ChatRequestParts* out, ApiError* error) {
  const ojson* tc = find_present(body, "tool_choice");
  if (tc == nullptr) return true;  // "auto" (with tools; nothing to call without)
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "none") {
      out->tool_choice = ToolChoice::kNone;
      return true;
    }
    if (s == "auto") return true;
    if (s == "required") {
      if (!has_tools) return fail(error, "tool_choice", "\"required\" needs at least one function in 'tools'");
      out->tool_choice = ToolChoice::kRequired;
      return true;
    }
    return fail(error, "tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
  }
  if (tc->is_object()) {
    const ojson* fn = find_present(*tc, "function");
    const ojson* name = fn != nullptr && fn->is_object() ? find_present(*fn, "name") : nullptr;
    if (find_present(*tc, "type") == nullptr || *find_present(*tc, "type") != "function" || name == nullptr ||
        !name->is_string())
      return fail(error, "tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!only_keys(*tc, "tool_choice", {"type", "function"}, error)) return false;
    if (!only_keys(*fn, "tool_choice.function", {"name"}, error)) return false;
    if (!has_tools) return fail(error, "tool_choice", "names a function, but the request has no 'tools'");
    const std::string wanted = name->get<std::string>();
    const ojson& tools = out->context["tools"];
    const bool known = std::any_of(tools.begin(), tools.end(), [&](const ojson& t) { return t["function"]["name"] == wanted; });
    if (!known) return fail(error, "tool_choice", "names the function '" + wanted + "', which is not one of 'tools'");
    out->tool_choice = ToolChoice::kNamed;
    out->tool_name = wanted;
    return true;
  }
  return fail(error, "tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
}

// "chat_template_kwargs": {name: any JSON value}; null or absent = none.
bool read_template_kwargs(const ojson& body, ojson* out, ApiError* error) {
  const ojson* kwargs = find_present(body, "chat_template_kwargs");
  if (kwargs == nullptr) return true;
  if (!kwargs->is_object())
    return fail(error, "chat_template_kwargs", "must be an object of template variables, e.g. {\"enable_thinking\": false}");
  static constexpr const char* kContextOwn[] = {"messages", "tools", "documents", "add_generation_prompt",
                                                "bos_token", "eos_token", "chat_template_kwargs"};
  for (const auto& [name, value] : kwargs->items()) {
    const bool identifier = !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
                            std::all_of(name.begin(), name.end(), [](char c) {
                              return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
                            });
    if (!identifier) return fail(error, "chat_template_kwargs." + name, "is not a template variable name");
    if (std::find(std::begin(kContextOwn), std::end(kContextOwn), name) != std::end(kContextOwn))
      return fail(error, "chat_template_kwargs." + name, "is set by the request itself, not by chat_template_kwargs");
  }
  *out = *kwargs;
  return true;
}

}  // namespace

bool read_chat_messages_and_tools(const ojson& body, ChatRequestParts* out, ApiError* error) {
  ojson messages, tools, kwargs;
  if (!read_messages(body, &messages, error)) return false;
  if (!read_tools(body, &tools, &out->strict_tool, error)) return false;
  if (!read_template_kwargs(body, &kwargs, error)) return false;
  out->has_tools = !tools.is_null();
  out->context = ojson::object();
  out->context["messages"] = std::move(messages);
  out->context["tools"] = std::move(tools);
  out->context["documents"] = nullptr;
  out->context["add_generation_prompt"] = true;
  if (!kwargs.is_null()) out->context["chat_template_kwargs"] = std::move(kwargs);
  return true;
}

// Python's str.strip() set for ASCII: what continue_final_message trims from the final message.
constexpr const char* kStripped = " \t\n\r\f\v";

bool read_generation_prompt_fields(const ojson& body, ChatRequestParts* out, ApiError* error) {
  bool generation_prompt = true;
  for (const auto& [key, field] : {std::pair<const char*, bool*>{"add_generation_prompt", &generation_prompt},
                                   {"continue_final_message", &out->continue_final_message}}) {
    const ojson* v = find_present(body, key);
    if (v == nullptr) continue;
    if (!v->is_boolean()) return fail(error, key, "must be a boolean");
    *field = v->get<bool>();
  }
  if (out->continue_final_message) {
    if (generation_prompt && find_present(body, "add_generation_prompt") != nullptr)
      return fail(error, "continue_final_message",
                  "true continues the final message, so 'add_generation_prompt' cannot be true too");
    generation_prompt = false;  // vLLM's clients send continue_final_message alone
    const ojson& last = out->context["messages"].back();
    const auto content = last.find("content");
    if (content == last.end() || !content->is_string() ||
        content->get_ref<const std::string&>().find_first_not_of(kStripped) == std::string::npos)
      return fail(error, "continue_final_message", "true needs a final message with text to continue");
  }
  out->context["add_generation_prompt"] = generation_prompt;
  return true;
}

bool cut_after_final_message(const ojson& context, std::string* rendered, ApiError* error) {
  const std::string& final_text = context["messages"].back()["content"].get_ref<const std::string&>();
  const size_t first = final_text.find_first_not_of(kStripped);  // read_generation_prompt_fields: not all stripped
  const size_t last = final_text.find_last_not_of(kStripped);
  const std::string stripped = final_text.substr(first, last - first + 1);
  const size_t at = rendered->rfind(stripped);
  if (at == std::string::npos)
    return fail(error, "continue_final_message",
                "true, but the chat template's text does not hold the final message's content (the template "
                "changes it), so there is no place to continue from");
  // Where the template kept the message's trailing whitespace, the prompt keeps it too
  // (transformers' test, to the letter: a message with leading whitespace is cut stripped).
  const std::string_view kept = std::string_view(final_text).substr(first);
  const bool whole = first == 0 && rendered->compare(at, kept.size(), kept) == 0;
  rendered->resize(at + (whole ? kept.size() : stripped.size()));
  return true;
}

// "reasoning_effort": the template's variable of that name (its values are the template's).
bool read_reasoning_effort(const ojson& body, ChatRequestParts* out, ApiError* error) {
  const ojson* effort = find_present(body, "reasoning_effort");
  if (effort == nullptr) return true;
  if (!effort->is_string() || effort->get_ref<const std::string&>().empty())
    return fail(error, "reasoning_effort", "must be a non-empty string (\"low\", \"medium\", \"high\", ...)");
  const auto kwargs = out->context.find("chat_template_kwargs");
  if (kwargs != out->context.end() && kwargs->contains("reasoning_effort"))
    return fail(error, "reasoning_effort", "is given twice: here and in chat_template_kwargs");
  out->context["reasoning_effort"] = *effort;
  return true;
}

bool read_chat_request(const ojson& body, ChatRequestParts* out, ApiError* error) {
  *out = ChatRequestParts();
  if (!read_chat_messages_and_tools(body, out, error)) return false;
  if (!read_generation_prompt_fields(body, out, error)) return false;
  if (!read_reasoning_effort(body, out, error)) return false;
  if (!read_tool_choice(body, out->has_tools, out, error)) return false;
  if (const ojson* p = find_present(body, "parallel_tool_calls"); p != nullptr) {
    if (!p->is_boolean()) return fail(error, "parallel_tool_calls", "must be a boolean");
    out->parallel_tool_calls = p->get<bool>();
  }
  return true;
}

ApiError chat_render_error(const Status& status) {
  const std::string message = "chat template: " + status.message();
  if (status.code() != StatusCode::kInvalidArgument) return api_server_error(message);
  for (const char* field : {"chat_template_kwargs", "reasoning_effort"})
    if (status.message().rfind(field, 0) == 0) return bad_request(field, message);
  return bad_request("messages", message);
}

}  // namespace tessera
