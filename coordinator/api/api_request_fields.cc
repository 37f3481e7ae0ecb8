#include "coordinator/api/api_request_fields.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace tessera {

using nlohmann::json;

namespace {

enum : unsigned { kCompletions = 1, kChat = 2, kBoth = 3 };

struct Field {
  std::string_view name;
  unsigned endpoints;
};

// Read by parse_api_request (coordinator/api/openai_request.cc) and honoured end to end.
constexpr Field kImplemented[] = {
    {"model", kBoth},
    {"temperature", kBoth},
    {"top_p", kBoth},
    {"top_k", kBoth},
    {"min_p", kBoth},
    {"presence_penalty", kBoth},
    {"frequency_penalty", kBoth},
    {"repetition_penalty", kBoth},
    {"seed", kBoth},
    {"n", kBoth},
    {"stream", kBoth},
    {"stream_options", kBoth},
    {"user", kBoth},  // recorded only: it identifies the caller, it changes no output
    {"max_tokens", kBoth},
    {"stop", kBoth},
    {"stop_token_ids", kBoth},
    {"ignore_eos", kBoth},
    {"skip_special_tokens", kBoth},
    {"speculative", kBoth},
    {"logit_bias", kBoth},
    {"min_tokens", kBoth},
    {"include_stop_str_in_output", kBoth},
    {"priority", kBoth},
    {"prompt", kCompletions},
    {"logprobs", kBoth},
    {"echo", kCompletions},
    {"best_of", kCompletions},
    {"suffix", kCompletions},  // refused by the parser unless empty: no model here has a FIM template
    {"messages", kChat},
    {"max_completion_tokens", kChat},
    {"top_logprobs", kChat},
    // Tools (coordinator/api/chat_request.h): rendered by the chat template, calls read back out
    // of the text (coordinator/api/tool_calls/); tool_choice "required" / a named function are
    // refused there.
    {"tools", kChat},
    {"tool_choice", kChat},
    {"parallel_tool_calls", kChat},
    {"chat_template_kwargs", kChat},
    {"add_generation_prompt", kChat},
    {"continue_final_message", kChat},
    {"include_reasoning", kChat},
    {"reasoning_effort", kChat},  // a template variable, for templates that read it (chat_request.h)
    // Structured output (coordinator/api/grammars/request_constraint.h): at most one of them.
    {"response_format", kBoth},
    {"guided_json", kBoth},
    {"guided_regex", kBoth},
    {"guided_choice", kBoth},
    {"guided_grammar", kBoth},
};

// Fields clients send at a value that asks for nothing Tessera lacks: accepted at that value
// only, refused (naming the field) at any other (tools on /v1/completions included).
bool is_noop_value(std::string_view name, const json& v) {
  if (name == "tools" || name == "functions") return v.is_array() && v.empty();
  if (name == "tool_choice") return v.is_string() && v.get<std::string>() == "none";
  if (name == "parallel_tool_calls") return v.is_boolean();  // only means something with tools
  if (name == "response_format") {
    auto type = v.is_object() ? v.find("type") : v.end();
    return v.is_object() && v.size() == 1 && type != v.end() && type->is_string() && *type == "text";
  }
  if (name == "use_beam_search") return v.is_boolean() && !v.get<bool>();
  if (name == "store") return v.is_boolean() && !v.get<bool>();
  return false;
}

// Why a known OpenAI/vLLM field is refused (its no-op value aside).
const char* refusal_reason(std::string_view name) {
  if (name.starts_with("guided_") || name == "structured_outputs")
    return "is not implemented by this server (structured output takes 'response_format', 'guided_json', "
           "'guided_regex', 'guided_choice' or 'guided_grammar')";
  if (name == "functions" || name == "function_call")
    return "is refused: the deprecated function-calling fields are not implemented; send 'tools' (and 'tool_choice')";
  if (name == "prompt_logprobs") return "is not supported: ask for prompt logprobs with 'echo': true and 'logprobs'";
  if (name == "use_beam_search" || name == "length_penalty") return "beam search is not implemented by this server";
  if (name == "allowed_token_ids" || name == "bad_words" || name == "logits_processors")
    return "is not implemented by this server";
  if (name == "store" || name == "metadata" || name == "service_tier" || name == "prediction" ||
      name == "modalities" || name == "audio" || name == "web_search_options")
    return "is not implemented by this server";
  if (name == "truncate_prompt_tokens" || name == "add_special_tokens" || name == "spaces_between_special_tokens" ||
      name == "return_tokens_as_token_ids" || name == "chat_template" || name == "documents")
    return "is not implemented by this server";
  return nullptr;
}

}  // namespace

bool check_request_fields(ApiEndpoint endpoint, const json& body, ApiError* error) {
  const unsigned here = endpoint == ApiEndpoint::kChatCompletions ? kChat : kCompletions;
  const char* where = endpoint == ApiEndpoint::kChatCompletions ? "/v1/chat/completions" : "/v1/completions";
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& name = it.key();
    if (it->is_null()) continue;  // clients send explicit nulls for defaults
    auto known = std::find_if(std::begin(kImplemented), std::end(kImplemented),
                              [&](const Field& f) { return f.name == name; });
    if (known != std::end(kImplemented)) {
      if (known->endpoints & here) continue;
      if (is_noop_value(name, *it)) continue;
      *error = bad_request(name, "'" + name + "' is not supported on " + where);
      return false;
    }
    if (is_noop_value(name, *it)) continue;
    if (const char* reason = refusal_reason(name)) {
      const std::string why = reason;
      *error = bad_request(name, "'" + name + "' " + (why.starts_with("is ") ? why : "is refused: " + why));
      return false;
    }
    *error = bad_request(name, "unknown field '" + name + "' (docs/api.md lists the fields " + where + " implements)");
    return false;
  }
  return true;
}

bool parse_logit_bias(const json& v, int64_t vocab, std::vector<std::pair<int32_t, float>>* out, ApiError* error) {
  if (!v.is_object()) {
    *error = bad_request("logit_bias", "'logit_bias' must be an object mapping token ids to biases in [-100, 100]");
    return false;
  }
  constexpr size_t kMaxEntries = 1024;
  if (v.size() > kMaxEntries) {
    *error = bad_request("logit_bias", "'logit_bias' may bias at most " + std::to_string(kMaxEntries) + " tokens");
    return false;
  }
  out->clear();
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    // Canonical decimal only ("7", not "07" or " 7"), so no two keys name one token.
    if (ec != std::errc() || end != key.data() + key.size() || key.empty() || (key.size() > 1 && key[0] == '0') ||
        id < 0) {
      *error = bad_request("logit_bias", "'logit_bias' key '" + key + "' is not a token id (a decimal integer)");
      return false;
    }
    if (vocab > 0 && id >= vocab) {
      *error = bad_request("logit_bias", "'logit_bias' token id " + key + " is outside the vocabulary of " +
                                             std::to_string(vocab) + " tokens");
      return false;
    }
    if (id > INT32_MAX) {
      *error = bad_request("logit_bias", "'logit_bias' token id " + key + " is out of range");
      return false;
    }
    const json& b = it.value();
    const double bias = b.is_number() ? b.get<double>() : NAN;
    if (!std::isfinite(bias) || bias < -100.0 || bias > 100.0) {
      *error = bad_request(param, "'" + param + "' must be a number in [-100, 100]");
      return false;
    }
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  std::sort(out->begin(), out->end());
  return true;
}

}  // namespace tessera
