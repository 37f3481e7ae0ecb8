#pragma once
// Chat templates: turns a list of chat messages into the prompt text a model was trained on,
// with the model's own Jinja template (tokenizer_config.json "chat_template") or a built-in
// fallback ("llama2", "chatml") when it has none. Only the Jinja subset real templates use
// is interpreted — text, {{ expr }}, {% if/elif/else/endif %}, {% for/else/endfor %},
// {% set %}, comments, whitespace control (-), and the trim_blocks + lstrip_blocks settings
// transformers renders with. Expressions: literals, variables, . and [] access, slices,
// loop.first/last/index/index0/length/revindex, + - * / % ~, comparisons, in, is [not]
// tests, and/or/not, a if c else b, filters (trim, upper, lower, length, first, last,
// string, default, join, replace, capitalize, title), string methods (strip, upper, lower,
// startswith, endswith, split) and raise_exception(). Anything else is an error naming it.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

namespace chat {
struct Node;
}

class ChatTemplate {
 public:
  // Parses a Jinja template. Unimplemented (naming the construct and its line) for syntax
  // outside the subset; InvalidArgument for malformed templates.
  static StatusOr<ChatTemplate> parse(std::string_view source);
  // A built-in template: "llama2" ([INST] ... [/INST]) or "chatml" (<|im_start|>role ...).
  static StatusOr<ChatTemplate> builtin(std::string_view name);
  // The tokenizer's chat template, or the built-in `fallback` when it has none; bos_token
  // and eos_token are the tokenizer's.
  static StatusOr<ChatTemplate> for_tokenizer(const Tokenizer& tokenizer, std::string_view fallback = "llama2");

  // Renders `messages`. raise_exception() in the template, or a type error, is
  // InvalidArgument with the message (the request's messages were not acceptable).
  StatusOr<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  void set_special_tokens(std::string bos_token, std::string eos_token) {
    bos_token_ = std::move(bos_token);
    eos_token_ = std::move(eos_token);
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const std::vector<chat::Node>> body_;
  std::string bos_token_ = "<s>";
  std::string eos_token_ = "</s>";
};

}  // namespace tessera
