// tessera-tokenize: encode text (or a file's exact bytes) to token ids, decode ids to text, or
// render a conversation with the chat template and encode that, with a Hugging Face
// tokenizer.json (or a GGUF file's vocabulary). Output is one JSON object on stdout:
// {"ids":[...]}, {"text":"..."} or {"prompt":"...","ids":[...]}. Errors: one line on stderr,
// exit code 1.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/gguf/gguf_file.h"
#include "common/input_file.h"
#include "common/logging.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/chat_request.h"
#include "coordinator/api/chat_template.h"
#include "tools/lib/main_guard.h"

namespace {

int fail(const std::string& message) {
  std::cerr << "tessera-tokenize: " << message << std::endl;
  return 1;
}

// "1,2,3" -> ids; a clear error naming the bad item otherwise.
tessera::StatusOr<std::vector<int32_t>> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    if (b == std::string::npos) {
      if (list.find_first_not_of(" \t") == std::string::npos) break;  // empty list
      return tessera::invalid_argument("--decode: empty item in '" + list + "'");
    }
    const std::string s = item.substr(b, e - b + 1);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || v < 0 || v > INT32_MAX) {
      return tessera::invalid_argument("--decode: '" + s + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// --chat-file: the conversation (POST /tokenize's "messages" body: messages, tools,
// add_generation_prompt, continue_final_message, chat_template_kwargs) read as the server
// reads a request, rendered with the chat template `setting` (server.chat_template's values)
// as the server renders it.
tessera::StatusOr<std::string> render_chat(const tessera::Tokenizer& tok, const std::string& chat_file,
                                           const std::string& setting) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, tessera::read_input_file(chat_file, "--chat-file", size_t{64} << 20));
  const nlohmann::ordered_json body = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return tessera::invalid_argument(chat_file + ": not a JSON object");
  for (const auto& [key, value] : body.items()) {
    if (key != "messages" && key != "tools" && key != "add_generation_prompt" && key != "continue_final_message" &&
        key != "chat_template_kwargs")
      return tessera::invalid_argument(
          chat_file + ": unknown field '" + key +
          "' (messages, tools, add_generation_prompt, continue_final_message, chat_template_kwargs)");
  }
  tessera::ChatRequestParts parts;
  tessera::ApiError error;
  const auto refused = [&] {
    return tessera::invalid_argument(chat_file + ": " + (error.param.empty() ? "" : error.param + ": ") + error.message);
  };
  if (!tessera::read_chat_messages_and_tools(body, &parts, &error)) return refused();
  if (!tessera::read_generation_prompt_fields(body, &parts, &error)) return refused();
  auto chat = tessera::ChatTemplate::from_setting(tok, setting);
  if (!chat.is_ok()) {  // named as the server's setting; here it is the flag
    std::string message = chat.status().message();
    const std::string key = "server.chat_template";
    if (message.rfind(key, 0) == 0) message = "--chat-template" + message.substr(key.size());
    return tessera::Status(chat.status().code(), message);
  }
  TESSERA_ASSIGN_OR_RETURN(std::string rendered, chat.value().render(parts.context));
  if (parts.continue_final_message && !tessera::cut_after_final_message(parts.context, &rendered, &error)) return refused();
  return rendered;
}

}  // namespace

namespace {

int tokenize_main(int argc, char** argv) {
  CLI::App app{"Encode text to token ids or decode ids to text (Hugging Face tokenizer.json, or a GGUF file's vocabulary)"};
  std::string dir, text, text_file, decode_list, chat_file, chat_template;
  bool json = false, add_special = false, skip_special = false, no_cleanup = false;
  app.add_option("--tokenizer", dir,
                 "folder with tokenizer.json [and tokenizer_config.json], or a GGUF file (its own vocabulary, "
                 "unless a tokenizer.json lies beside it)")
      ->required();
  auto* text_opt = app.add_option("--text", text, "text to encode");
  auto* file_opt = app.add_option("--text-file", text_file, "file whose exact bytes are encoded");
  auto* decode_opt = app.add_option("--decode", decode_list, "comma-separated ids to decode");
  auto* chat_opt = app.add_option("--chat-file", chat_file,
                                  "render this conversation with the chat template and encode it, as POST /tokenize "
                                  "does with messages: a JSON object with messages [, tools, add_generation_prompt (default true), "
                                  "continue_final_message, chat_template_kwargs]");
  auto* template_opt = app.add_option("--chat-template", chat_template,
                                      "with --chat-file: the template, as server.chat_template takes it (llama2, "
                                      "chatml, or a file holding the template; default: the tokenizer's)");
  template_opt->needs(chat_opt);
  text_opt->excludes(file_opt)->excludes(decode_opt)->excludes(chat_opt);
  file_opt->excludes(decode_opt)->excludes(chat_opt);
  decode_opt->excludes(chat_opt);
  app.add_flag("--json", json, "print JSON (the only output format; accepted for scripts)");
  app.add_flag("--add-special-tokens", add_special, "apply the post-processor (e.g. BOS) when encoding");
  app.add_flag("--skip-special-tokens", skip_special, "leave special tokens out when decoding");
  app.add_flag("--no-cleanup", no_cleanup,
               "decode as the tokenizers library does: without transformers' clean-up of spaces before "
               "punctuation, which tokenizer_config.json's clean_up_tokenization_spaces otherwise turns on");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }
  if (text_opt->count() + file_opt->count() + decode_opt->count() + chat_opt->count() == 0) {
    return fail("one of --text, --text-file, --decode or --chat-file is required");
  }
  tessera::init_logging("tok", spdlog::level::warn);  // stdout is the JSON answer alone

  // A .gguf is read as the servers read it: its vocabulary, or a tokenizer.json beside it.
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  auto tok = tessera::is_gguf_path(dir) ? tessera::load_model_tokenizer(dir, parent.empty() ? "." : parent.string())
                                        : tessera::Tokenizer::load(dir);
  if (!tok.is_ok()) return fail(tok.status().to_string());

  nlohmann::json out;
  if (decode_opt->count() > 0) {
    auto ids = parse_ids(decode_list);
    if (!ids.is_ok()) return fail(ids.status().message());
    const int64_t vocab = tok.value()->vocab_size();
    for (int32_t id : ids.value()) {
      if (id < 0 || id >= vocab) {
        return fail("--decode: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(vocab) + ")");
      }
    }
    out["text"] = no_cleanup ? tok.value()->decode_without_cleanup(ids.value(), skip_special)
                             : tok.value()->decode(ids.value(), skip_special);
  } else if (chat_opt->count() > 0) {
    auto prompt = render_chat(*tok.value(), chat_file, chat_template);
    if (!prompt.is_ok()) return fail(prompt.status().message());
    out["prompt"] = prompt.value();
    out["ids"] = tok.value()->encode(prompt.value(), add_special);  // the template carries BOS
  } else {
    if (file_opt->count() > 0) {
      auto read = tessera::read_input_file(text_file, "--text-file", size_t{1} << 30);
      if (!read.is_ok()) return fail(read.status().message());
      text = std::move(read).value();
    }
    out["ids"] = tok.value()->encode(text, add_special);
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run_guarded("tessera-tokenize", [&] { return tokenize_main(argc, argv); });
}
