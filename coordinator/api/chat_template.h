#pragma once
// Chat templates: turns a conversation into the prompt text a model was trained on, with the
// model's own Jinja template (tokenizer_config.json "chat_template") rendered as transformers'
// apply_chat_template renders it (coordinator/api/jinja/: a Jinja2 engine with Python Jinja2
// semantics), or a built-in template ("llama2", "chatml") when the model has none.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/jinja/template.h"

namespace tessera {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // Parses a Jinja template: InvalidArgument (malformed) or Unimplemented (include, extends,
  // import) naming the construct and its line.
  static StatusOr<ChatTemplate> parse(std::string_view source);
  // A built-in template: "llama2" ([INST] ... [/INST]) or "chatml" (<|im_start|>role ...).
  static StatusOr<ChatTemplate> builtin(std::string_view name);
  // The tokenizer's chat template, or the built-in `fallback` when it has none; bos_token
  // and eos_token are the tokenizer's (undefined in the template when it has none).
  static StatusOr<ChatTemplate> for_tokenizer(const Tokenizer& tokenizer, std::string_view fallback = "llama2");
  // server.chat_template: "" = for_tokenizer(tokenizer); "llama2" / "chatml" = that
  // built-in; else the path of a file whose text is the template. A missing or unreadable
  // file, or one that does not parse (construct and line), is an error naming the setting.
  // bos_token / eos_token are the tokenizer's.
  static StatusOr<ChatTemplate> from_setting(const Tokenizer& tokenizer, const std::string& setting);

  // Renders role + content messages. raise_exception() in the template, or a type error, is
  // InvalidArgument with the message (the request's messages were not acceptable).
  StatusOr<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // Renders with the whole context as transformers passes it: `messages` (any fields:
  // content as a string or a list of parts, tool_calls, tool_call_id, name, ...), and
  // optionally `tools`, `documents` (null when absent), `add_generation_prompt` (false when
  // absent), `bos_token` / `eos_token` (this template's when absent) and any extra variables.
  // Objects keep their key order (tojson prints tool schemas in the client's order), so
  // parse request bodies as ordered_json; a plain json context renders its keys sorted.
  // A "chat_template_kwargs" object in the context (a request's, read by chat_request.h) is
  // spread into template variables, as transformers' apply_chat_template(**kwargs) does — each
  // must be a name the template's text mentions, else InvalidArgument beginning
  // "chat_template_kwargs" and naming it (a misspelt "enable_thinkng" would otherwise change
  // nothing, silently).
  StatusOr<std::string> render(const nlohmann::ordered_json& context) const;
  // Whether the template's text mentions `name` as a whole identifier.
  bool mentions(std::string_view name) const;
  StatusOr<std::string> render(const nlohmann::json& context) const;

  void set_special_tokens(std::optional<std::string> bos_token, std::optional<std::string> eos_token) {
    bos_token_ = std::move(bos_token);
    eos_token_ = std::move(eos_token);
  }
  // Output, depth and step limits, and strftime_now's time (tests pin it).
  void set_limits(jinja::RenderLimits limits) { limits_ = std::move(limits); }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
  std::optional<std::string> bos_token_ = "<s>";
  std::optional<std::string> eos_token_ = "</s>";
  jinja::RenderLimits limits_;
};

}  // namespace tessera
