#include "coordinator/api/chat_template.h"

#include <cctype>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/input_file.h"

namespace tessera {
namespace {

// The built-in templates (for models without one): Llama 2's chat format and ChatML.
constexpr std::string_view kLlama2Template =
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] | trim %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('llama2 chat template: roles must alternate user/assistant after an optional system message') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' }}"
    "{% if loop.first and system %}{{ '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}{% endif %}"
    "{{ message['content'] | trim }}{{ ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}";

constexpr std::string_view kChatmlTemplate =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(source));
  ChatTemplate out;
  out.source_ = std::string(source);
  out.template_ = std::make_shared<const jinja::Template>(std::move(t));
  return out;
}

StatusOr<ChatTemplate> ChatTemplate::builtin(std::string_view name) {
  if (name == "llama2") return parse(kLlama2Template);
  if (name == "chatml") return parse(kChatmlTemplate);
  return invalid_argument("unknown built-in chat template '" + std::string(name) + "' (llama2, chatml)");
}

StatusOr<ChatTemplate> ChatTemplate::for_tokenizer(const Tokenizer& tokenizer, std::string_view fallback) {
  StatusOr<ChatTemplate> t = tokenizer.chat_template().empty() ? builtin(fallback) : parse(tokenizer.chat_template());
  if (!t.is_ok()) return t.status().with_context("the model's chat template");
  std::optional<std::string> bos, eos;
  if (tokenizer.bos_id() >= 0) bos = tokenizer.id_to_token(tokenizer.bos_id());
  if (tokenizer.eos_id() >= 0) eos = tokenizer.id_to_token(tokenizer.eos_id());
  t->set_special_tokens(std::move(bos), std::move(eos));
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::from_setting(const Tokenizer& tokenizer, const std::string& setting) {
  if (setting.empty()) return for_tokenizer(tokenizer);
  StatusOr<ChatTemplate> t = invalid_argument("");
  if (setting == "llama2" || setting == "chatml") {
    t = builtin(setting);
  } else {
    StatusOr<std::string> text = read_input_file(setting, "server.chat_template");
    if (text.status().code() == StatusCode::kNotFound)
      return not_found("server.chat_template: '" + setting +
                       "' is neither a built-in template (llama2, chatml) nor a readable file");
    if (!text.is_ok()) return text.status();
    if (text->empty()) return invalid_argument("server.chat_template: " + setting + ": the file is empty");
    t = parse(*text);
  }
  if (!t.is_ok()) return t.status().with_context("server.chat_template " + setting);
  std::optional<std::string> bos, eos;
  if (tokenizer.bos_id() >= 0) bos = tokenizer.id_to_token(tokenizer.bos_id());
  if (tokenizer.eos_id() >= 0) eos = tokenizer.id_to_token(tokenizer.eos_id());
  t->set_special_tokens(std::move(bos), std::move(eos));
  return t;
}

StatusOr<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = std::move(list);
  ctx["add_generation_prompt"] = add_generation_prompt;
  return render(ctx);
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json(context));
}

StatusOr<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!template_) return invalid_argument("empty chat template");
  if (!context.is_object()) return invalid_argument("the chat template context must be a JSON object");
  auto messages = context.find("messages");
  if (messages == context.end() || !messages->is_array())
    return invalid_argument("the chat template context needs 'messages' (a list)");
  nlohmann::ordered_json ctx = context;
  // As transformers' apply_chat_template: tools and documents are None when not given.
  if (!ctx.contains("tools")) ctx["tools"] = nullptr;
  if (!ctx.contains("documents")) ctx["documents"] = nullptr;
  if (!ctx.contains("add_generation_prompt")) ctx["add_generation_prompt"] = false;
  if (!ctx.contains("bos_token") && bos_token_) ctx["bos_token"] = *bos_token_;
  if (!ctx.contains("eos_token") && eos_token_) ctx["eos_token"] = *eos_token_;
  // A request's reasoning_effort is a variable only some templates read; nowhere else it
  // would change nothing, so it is refused rather than dropped.
  if (ctx.contains("reasoning_effort") && !mentions("reasoning_effort"))
    return invalid_argument("reasoning_effort: this model's chat template never reads 'reasoning_effort'");
  if (auto kwargs = ctx.find("chat_template_kwargs"); kwargs != ctx.end()) {
    const nlohmann::ordered_json extra = std::move(*kwargs);
    ctx.erase("chat_template_kwargs");
    for (const auto& [name, value] : extra.items()) {
      if (!mentions(name))
        return invalid_argument("chat_template_kwargs: the chat template never reads '" + name + "'");
      ctx[name] = value;
    }
  }
  return template_->render(ctx, limits_);
}

bool ChatTemplate::mentions(std::string_view name) const {
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
  if (name.empty()) return false;
  for (size_t at = source_.find(name); at != std::string::npos; at = source_.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at == 0 || !is_word(source_[at - 1])) && (end == source_.size() || !is_word(source_[end]))) return true;
  }
  return false;
}

}  // namespace tessera
