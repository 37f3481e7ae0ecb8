// parse_api_request: an OpenAI request body (/v1/completions, /v1/chat/completions) read
// into the engine's Requests, one field group at a time; the first invalid field is the 400.
// The response side is in openai_api.cc.
#include "coordinator/api/openai_api.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "coordinator/api/api_request_fields.h"
#include "coordinator/api/chat_request.h"
#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/api/prompt_input.h"
#include "coordinator/api/request_body.h"
#include "coordinator/api/tool_calls/tool_call_grammar.h"

namespace tessera {

using nlohmann::json;

namespace {


constexpr int kMaxN = 128;
constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStopStrings = 16;

// Reads optional fields of one JSON object; the first invalid one is recorded and every
// later read is a no-op, so parsing reads straight through and checks once at the end.
class FieldReader {
 public:
  FieldReader(const json& object, ApiError* error) : object_(object), error_(error) {}

  bool failed() const { return failed_; }
  void fail(const std::string& param, const std::string& message) {
    if (failed_) return;
    failed_ = true;
    *error_ = bad_request(param, message);
  }

  // Null counts as absent (clients send explicit nulls for defaults).
  const json* find(const char* name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void number(const char* name, float* out, double lo, double hi, bool lo_open = false) {
    const json* v = find(name);
    if (failed_ || v == nullptr) return;
    if (!v->is_number()) return fail(name, std::string("'") + name + "' must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "'%s' must be in %s%g, %g] (got %g)", name, lo_open ? "(" : "[", lo, hi, d);
      return fail(name, buf);
    }
    *out = static_cast<float>(d);
  }

  bool integer(const char* name, int64_t* out, int64_t lo, int64_t hi) {
    const json* v = find(name);
    if (failed_ || v == nullptr) return false;
    if (!v->is_number_integer()) {
      fail(name, std::string("'") + name + "' must be an integer");
      return false;
    }
    int64_t x = 0;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
    } else {
      x = v->get<int64_t>();
    }
    if (x < lo || x > hi) {
      fail(name, std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "] (got " + std::to_string(x) + ")");
      return false;
    }
    *out = x;
    return true;
  }

  bool integer(const char* name, int* out, int64_t lo, int64_t hi) {
    int64_t x = 0;
    if (!integer(name, &x, lo, hi)) return false;
    *out = static_cast<int>(x);
    return true;
  }

  bool boolean(const char* name, bool* out) {
    const json* v = find(name);
    if (failed_ || v == nullptr) return false;
    if (!v->is_boolean()) {
      fail(name, std::string("'") + name + "' must be a boolean");
      return false;
    }
    *out = v->get<bool>();
    return true;
  }

  void string(const char* name, std::string* out) {
    const json* v = find(name);
    if (failed_ || v == nullptr) return;
    if (!v->is_string()) return fail(name, std::string("'") + name + "' must be a string");
    *out = v->get<std::string>();
  }

 private:
  const json& object_;
  ApiError* error_;
  bool failed_ = false;
};

// "prompt": a string, an array of strings (a batch), an array of token ids, or an array of
// token-id arrays (a batch).
bool parse_prompt(const json& body, const ApiContext& ctx, ApiRequest* out, std::vector<std::vector<int32_t>>* prompts,
                  ApiError* error) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    *error = bad_request("prompt", "'prompt' is required");
    return false;
  }
  return read_prompt_input(*it, "prompt", ctx.tokenizer, prompts, &out->prompt_texts, error);
}

// tool_choice "required" or a named function, or "auto" with a strict tool: the reply is
// decoded under the grammar of the calls (coordinator/api/tool_calls/tool_call_grammar.h),
// compiled once per tools/format/choice.
struct ForcedCall {
  std::string field;  // what asked for it ("tool_choice", "tools[2].function.strict"); "": nothing
  std::string what;   // how, for messages ("'tool_choice' \"required\"")
  std::shared_ptr<const structured::TokenConstraint> constraint;
};

// What a grammar lets the model write before the constrained text: a reasoning model thinks
// first (its thoughts free, the grammar holding for the answer), unless the prompt closed its
// thoughts already (Qwen3 with enable_thinking false).
structured::ThoughtsBefore thoughts_before_grammar(const ApiRequest& request) {
  if (request.reasoning_format != ReasoningFormat::kThinkTags || request.prompt_texts.empty())
    return structured::ThoughtsBefore::kNone;
  if (request.starts_in_reasoning) return structured::ThoughtsBefore::kOpen;
  return prompt_closes_reasoning(request.prompt_texts.back()) ? structured::ThoughtsBefore::kNone
                                                              : structured::ThoughtsBefore::kOptional;
}

bool forced_call_constraint(const ChatRequestParts& parts, const ApiContext& ctx, structured::ThoughtsBefore thoughts,
                            ForcedCall* forced, ApiError* error) {
  const bool content_allowed = parts.tool_choice == ToolChoice::kAuto;
  const std::string asks = content_allowed ? forced->what + " holds tool calls to their schema"
                                           : forced->what + " forces a tool call";
  if (!ctx.tool_call_parser) {
    *error = bad_request(forced->field, asks + ", but this server reads no tool calls: server.tool_call_parser is "
                                               "none (or auto found no call format in the chat template)");
    return false;
  }
  if (ctx.tool_call_vocabulary == nullptr) {
    *error = bad_request(forced->field, asks + ", which needs the model's tokenizer");
    return false;
  }
  ToolCallGrammarSpec spec;
  spec.format = ctx.tool_call_format;
  spec.tools = &parts.context["tools"];
  spec.only_function = parts.tool_choice == ToolChoice::kNamed ? parts.tool_name : "";
  spec.parallel = parts.parallel_tool_calls;
  spec.content_allowed = content_allowed;
  spec.thoughts = thoughts;
  const std::string key = std::string("tools\x01") + tool_call_format_name(spec.format) + "\x01" +
                          (spec.parallel ? "1" : "0") + (content_allowed ? "c" : "") + "\x01" +
                          structured::thoughts_key(thoughts) + "\x01" + spec.only_function + "\x01" + spec.tools->dump();
  std::string param;
  StatusOr<std::shared_ptr<const structured::TokenConstraint>> c =
      structured::cached_constraint(ctx.tool_call_vocabulary, key, [&] { return compile_tool_call_grammar(spec, &param); });
  if (!c.is_ok()) {
    *error = bad_request(param.empty() ? "tools" : param == "tool_choice" ? forced->field : param, c.status().message());
    return false;
  }
  forced->constraint = std::move(c).value();
  return true;
}

// The chat template's context from "messages" / "tools" (coordinator/api/chat_request.h), then
// the prompt it renders. A render error the template raised (raise_exception, a type error
// on the request's values) is the client's 400; any other is the server's 500.
bool parse_messages(const nlohmann::ordered_json& body, const ApiContext& ctx, ApiRequest* out,
                    std::vector<std::vector<int32_t>>* prompts, ForcedCall* forced, ApiError* error) {
  ChatRequestParts parts;
  if (!read_chat_request(body, &parts, error)) return false;
  if (ctx.tokenizer == nullptr) {
    *error = bad_request("messages", "this server has no tokenizer: chat completions are unavailable");
    return false;
  }
  if (!ctx.chat_renderer) {
    *error = api_server_error("this server has no chat template: chat completions are unavailable");
    return false;
  }
  const bool read_calls = parts.has_tools && parts.tool_choice != ToolChoice::kNone && ctx.tool_call_parser;
  if (parts.has_tools && parts.tool_choice != ToolChoice::kNone && !ctx.tool_calls_out) {
    *error = bad_request("tools", "this API does not return tool calls (use the HTTP API, or 'tool_choice': \"none\")");
    return false;
  }
  if (read_calls) {
    out->tool_call_parser = ctx.tool_call_parser;
    out->parallel_tool_calls = parts.parallel_tool_calls;
  }
  StatusOr<std::string> rendered = ctx.chat_renderer(parts.context);
  if (!rendered.is_ok()) {
    *error = chat_render_error(rendered.status());
    return false;
  }
  if (parts.continue_final_message && !cut_after_final_message(parts.context, &rendered.value(), error)) return false;
  out->prompt_texts.push_back(std::move(rendered).value());
  out->reasoning = ctx.reasoning != ReasoningFormat::kNone;
  out->reasoning_format = ctx.reasoning;
  out->starts_in_reasoning =
      ctx.reasoning == ReasoningFormat::kThinkTags && prompt_opens_reasoning(out->prompt_texts.back());
  if (parts.tool_choice == ToolChoice::kRequired || parts.tool_choice == ToolChoice::kNamed) {
    forced->field = "tool_choice";
    forced->what = parts.tool_choice == ToolChoice::kRequired ? "'tool_choice' \"required\"" : "'tool_choice' naming a function";
  } else if (parts.tool_choice == ToolChoice::kAuto && parts.strict_tool >= 0) {
    forced->field = "tools[" + std::to_string(parts.strict_tool) + "].function.strict";
    forced->what = "'" + forced->field + "' true";
  }
  if (!forced->field.empty() && !forced_call_constraint(parts, ctx, thoughts_before_grammar(*out), forced, error))
    return false;
  prompts->push_back(ctx.tokenizer->encode(out->prompt_texts.back(), false));
  if (prompts->back().empty()) {
    *error = bad_request("messages", "'messages' render to an empty prompt");
    return false;
  }
  return true;
}

// The body as JSON: depth-checked before parsing, then an object. Chat bodies keep their key
// order: the template prints tool schemas and arguments with tojson, in the client's order
// (Python dict order), so they are read as ordered_json; `j` is the same body unordered.
bool parse_body(std::string_view body, nlohmann::ordered_json* ordered, json* j, ApiError* error) {
  if (!check_request_body(body, error)) return false;
  *ordered = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (ordered->is_discarded()) {
    *error = bad_request("", "the request body is not valid JSON");
    return false;
  }
  *j = *ordered;
  if (!j->is_object()) {
    *error = bad_request("", "the request body must be a JSON object");
    return false;
  }
  return true;
}

// "model" names the served model (or is absent); the endpoint's required field comes before
// the others (a chat body sent to /v1/completions lacks 'prompt'); then unknown fields.
bool check_model_and_fields(ApiEndpoint endpoint, const json& j, const ApiContext& ctx, FieldReader& f,
                            ApiRequest* out, ApiError* error) {
  std::string model;
  f.string("model", &model);
  if (f.failed()) return false;
  if (!ctx.served().find(model, &out->lora)) {
    *error = model_not_found(model, ctx.served());
    return false;
  }
  if (!out->lora.empty()) out->model = out->lora;  // responses name the adapter, as vLLM's do
  const char* required = endpoint == ApiEndpoint::kChatCompletions ? "messages" : "prompt";
  if (auto it = j.find(required); it == j.end() || it->is_null()) {
    *error = bad_request(required, std::string("'") + required + "' is required");
    return false;
  }
  return check_request_fields(endpoint, j, error);
}

// What every Request made from one API request shares, read field group by field group (in
// the order the first error is reported in).
struct RequestTemplate {
  SamplingParams sampling;
  int max_tokens = -1;  // -1: the endpoint's default (completions 16, chat the rest of the context)
  const char* max_field = "max_tokens";
  bool include_stop = false;
  int priority = 0;
  StopConditions stop;
  std::vector<std::string> stop_strings;
  bool skip_special = true;
  bool speculative = true;
  std::shared_ptr<const structured::TokenConstraint> constraint;
};

void read_sampling_fields(FieldReader& f, SamplingParams* sp) {
  f.number("temperature", &sp->temperature, 0.0, 2.0);
  f.number("top_p", &sp->top_p, 0.0, 1.0, /*lo_open=*/true);
  int top_k = 0;
  if (f.integer("top_k", &top_k, -1, INT32_MAX) && top_k == -1) top_k = 0;  // vLLM: -1 = off
  sp->top_k = top_k;
  f.number("min_p", &sp->min_p, 0.0, 1.0);
  f.number("presence_penalty", &sp->presence_penalty, -2.0, 2.0);
  f.number("frequency_penalty", &sp->frequency_penalty, -2.0, 2.0);
  f.number("repetition_penalty", &sp->repetition_penalty, 0.0, 10.0, /*lo_open=*/true);
  int64_t seed = 0;
  if (f.integer("seed", &seed, INT64_MIN, INT64_MAX)) sp->seed = static_cast<uint64_t>(seed);
}

// "n", "stream", and the completions-only "best_of" and "suffix".
void read_choice_fields(FieldReader& f, bool chat, const ApiContext& ctx, ApiRequest* out) {
  f.integer("n", &out->n, 1, kMaxN);
  f.boolean("stream", &out->stream);
  out->best_of = out->n;
  if (!chat && f.integer("best_of", &out->best_of, 1, kMaxN) && !f.failed()) {
    if (out->best_of < out->n)
      f.fail("best_of", "'best_of' (" + std::to_string(out->best_of) + ") must be >= 'n' (" + std::to_string(out->n) + ")");
    else if (out->stream && out->best_of > out->n)
      f.fail("best_of", "'best_of' > 'n' cannot be streamed (the best choices are known only at the end)");
  }
  if (const json* sfx = f.find("suffix"); sfx != nullptr && !f.failed()) {
    if (!sfx->is_string())
      f.fail("suffix", "'suffix' must be a string");
    else if (!sfx->get<std::string>().empty())
      f.fail("suffix", "'suffix' needs a fill-in-the-middle template, which the served model '" + ctx.model_name +
                           "' does not define");
  }
}

void read_stream_options(FieldReader& f, ApiRequest* out) {
  const json* so = f.find("stream_options");
  if (so == nullptr || f.failed()) return;
  if (!so->is_object()) {
    f.fail("stream_options", "'stream_options' must be an object");
  } else if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
    if (!iu->is_boolean())
      f.fail("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
    else
      out->include_usage = iu->get<bool>();
  }
}

// "logit_bias", "min_tokens", "include_stop_str_in_output", "priority", "stream_options", "user".
bool read_request_options(FieldReader& f, const ApiContext& ctx, RequestTemplate* t, ApiRequest* out,
                          ApiError* error) {
  if (const json* lb = f.find("logit_bias"); lb != nullptr && !f.failed()) {
    if (!parse_logit_bias(*lb, ctx.tokenizer != nullptr ? ctx.tokenizer->vocab_size() : 0, &t->sampling.logit_bias,
                          error))
      return false;
  }
  f.integer("min_tokens", &t->sampling.min_tokens, 0, INT32_MAX);
  f.boolean("include_stop_str_in_output", &t->include_stop);
  f.integer("priority", &t->priority, INT32_MIN, INT32_MAX);
  read_stream_options(f, out);
  f.string("user", &out->user);
  return true;
}

// Output length: completions "max_tokens" (default 16); chat "max_completion_tokens" or
// "max_tokens" (default: the rest of the context).
void read_max_tokens(FieldReader& f, bool chat, RequestTemplate* t) {
  if (chat && f.find("max_completion_tokens") != nullptr) {
    t->max_field = "max_completion_tokens";
    f.integer("max_completion_tokens", &t->max_tokens, 1, INT32_MAX);
  } else {
    f.integer("max_tokens", &t->max_tokens, 1, INT32_MAX);
  }
}

// Chat: "logprobs" (a boolean) and "top_logprobs"; completions: "logprobs" (a count) and "echo".
void read_logprobs(FieldReader& f, bool chat, ApiRequest* out, SamplingParams* sp) {
  if (chat) {
    bool want = false;
    f.boolean("logprobs", &want);
    int top = 0;
    const bool has_top = f.integer("top_logprobs", &top, 0, kMaxLogprobs);
    if (has_top && !want && !f.failed()) f.fail("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (want) out->logprobs = top;
  } else {
    f.integer("logprobs", &out->logprobs, 0, kMaxLogprobs);
    f.boolean("echo", &out->echo);
    // echo + logprobs: the prompt's tokens are scored too (in the same prefill).
    if (out->echo && out->logprobs >= 0) sp->prompt_logprobs = out->logprobs;
  }
  if (out->logprobs >= 0) sp->logprobs = out->logprobs;
}

// Chat: "include_reasoning" (vLLM's; a reasoning model's thoughts in reasoning_content).
void read_reasoning_fields(FieldReader& f, bool chat, ApiRequest* out) {
  if (chat) f.boolean("include_reasoning", &out->include_reasoning);
}

// "stop": a string or an array of strings; empty strings stop nothing and are dropped.
void read_stop_strings(FieldReader& f, std::vector<std::string>* stop_strings) {
  const json* st = f.find("stop");
  if (st == nullptr || f.failed()) return;
  if (st->is_string()) {
    if (!st->get<std::string>().empty()) stop_strings->push_back(st->get<std::string>());
  } else if (st->is_array() && st->size() <= kMaxStopStrings && all_of_kind(*st, &json::is_string)) {
    for (const json& s : *st)
      if (!s.get<std::string>().empty()) stop_strings->push_back(s.get<std::string>());
  } else {
    f.fail("stop", "'stop' must be a string or an array of at most " + std::to_string(kMaxStopStrings) + " strings");
  }
}

// Stops: "stop", vLLM's "stop_token_ids", "ignore_eos" and "skip_special_tokens".
bool read_stop_fields(FieldReader& f, const ApiContext& ctx, RequestTemplate* t, ApiError* error) {
  read_stop_strings(f, &t->stop_strings);
  if (ctx.tokenizer != nullptr && ctx.tokenizer->eos_id() >= 0) t->stop.eos_token_id = ctx.tokenizer->eos_id();
  f.boolean("ignore_eos", &t->stop.ignore_eos);
  if (const json* ids = f.find("stop_token_ids"); ids != nullptr && !f.failed()) {
    if (!ids->is_array() || !all_of_kind(*ids, &json::is_number_integer)) {
      f.fail("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    } else {
      std::vector<int32_t> v;
      if (!token_ids_from(*ids, "stop_token_ids", ctx.tokenizer, &v, error)) return false;
      t->stop.stop_token_ids = std::move(v);
    }
  }
  f.boolean("skip_special_tokens", &t->skip_special);
  f.boolean("speculative", &t->speculative);
  return true;
}

// Structured output: the fields checked first (in the order fields are reported), the grammar
// every choice follows compiled (or found in the cache) once the prompt says whether a
// reasoning model thinks before it.
bool read_output_constraint(const nlohmann::ordered_json& ordered, const ApiContext& ctx,
                            std::optional<structured::RequestedConstraint>* requested, ApiError* error) {
  if (std::string param, message;
      !structured::read_request_constraint(ordered, ctx.token_vocabulary, requested, &param, &message)) {
    *error = bad_request(param, message);
    return false;
  }
  return true;
}

bool compile_output_constraint(const std::optional<structured::RequestedConstraint>& requested, const ApiContext& ctx,
                               const ApiRequest& request,
                               std::shared_ptr<const structured::TokenConstraint>* constraint, ApiError* error) {
  if (!requested) return true;
  if (std::string param, message; !structured::compile_requested_constraint(
          *requested, ctx.token_vocabulary, thoughts_before_grammar(request), constraint, &param, &message)) {
    *error = bad_request(param, message);
    return false;
  }
  return true;
}

// A forced tool call's grammar becomes the output's; and a call marker that is a special
// token must reach the tool-call parser (vLLM does the same).
bool apply_tool_call_fields(const nlohmann::ordered_json& ordered, const json& j, const ApiContext& ctx,
                            const ApiRequest& out, const ForcedCall& forced, RequestTemplate* t, ApiError* error) {
  if (forced.constraint) {
    // One grammar per output: a forced call and response_format / guided_* cannot both hold
    // (vLLM refuses the pair too).
    if (t->constraint) {
      std::string field;
      for (const char* f : {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"})
        if (auto it = ordered.find(f); field.empty() && it != ordered.end() && !it->is_null()) field = f;
      *error = bad_request(forced.field, forced.what + " and '" + field + "' both constrain the output; send only one");
      return false;
    }
    // The call starts with a special token (Mistral's [TOOL_CALLS]): its text must reach the
    // parser, which skip_special_tokens true would hide.
    if (ctx.tool_call_vocabulary != ctx.token_vocabulary && j.value("skip_special_tokens", false)) {
      *error = bad_request("skip_special_tokens",
                           "'skip_special_tokens': true would hide the " +
                               std::string(out.tool_call_parser->special_marker()) +
                               " marker a tool call starts with, and no call could be read; leave it out");
      return false;
    }
    t->constraint = forced.constraint;
  }
  if (out.tool_call_parser && out.tool_call_parser->marker_is_special_token() &&
      j.value("skip_special_tokens", json()).is_null())
    t->skip_special = false;
  return true;
}

// gpt-oss's harmony channels are special tokens: the reader needs them in the text, so a
// request keeps special tokens unless it says otherwise, and one that hides them is refused.
// Its grammars would have to spell those tokens out: structured output is refused there too.
bool apply_harmony_fields(const nlohmann::ordered_json& ordered, const json& j, const ApiRequest& out,
                          RequestTemplate* t, ApiError* error) {
  if (out.reasoning_format != ReasoningFormat::kHarmony) return true;
  if (j.value("skip_special_tokens", false)) {
    *error = bad_request("skip_special_tokens",
                         "'skip_special_tokens': true would hide the harmony channel markers this model (gpt-oss) "
                         "writes, and its thoughts could not be told from its answer; leave it out");
    return false;
  }
  if (j.value("skip_special_tokens", json()).is_null()) t->skip_special = false;
  if (t->constraint) {
    for (const char* f : {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"})
      if (auto it = ordered.find(f); it != ordered.end() && !it->is_null()) {
        *error = bad_request(f, "'" + std::string(f) +
                                    "': structured output is not supported yet on a model that writes harmony "
                                    "channels (gpt-oss; server.reasoning_parser gpt_oss)");
        return false;
      }
  }
  return true;
}

// The completion length for a prompt of `prompt_len` tokens: the request's, else the
// endpoint's default; -1 with `error` set when it, min_tokens or the prompt do not fit.
int completion_length(int prompt_len, bool chat, const ApiContext& ctx, const RequestTemplate& t, ApiError* error) {
  int mt = t.max_tokens;
  if (mt < 0) mt = chat ? std::max(0, ctx.max_model_len - prompt_len) : 16;
  if (t.sampling.min_tokens > mt) {
    *error = bad_request("min_tokens", "'min_tokens' (" + std::to_string(t.sampling.min_tokens) +
                                           ") must not exceed '" + t.max_field + "' (" + std::to_string(mt) + ")");
    return -1;
  }
  if (static_cast<int64_t>(prompt_len) + std::max(mt, 1) > ctx.max_model_len) {
    const char* where = chat ? "messages" : "prompt";
    *error = bad_request(prompt_len >= ctx.max_model_len ? where : t.max_field,
                         "This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                             " tokens. However, you requested " +
                             std::to_string(static_cast<int64_t>(prompt_len) + mt) + " tokens (" +
                             std::to_string(prompt_len) + " in the " + where + ", " + std::to_string(mt) +
                             " in the completion). Please reduce the length of the " + where + " or completion." +
                             (ctx.max_model_len_limit.empty() ? ""
                                                              : " (The limit is " + ctx.max_model_len_limit + ".)"));
    error->code = "context_length_exceeded";
    return -1;
  }
  return mt;
}

// One Request per prompt; each prompt moves into its Request. Choice c samples with seed + c
// (Request::choice_sampling).
bool add_requests(std::vector<std::vector<int32_t>>* prompts, bool chat, const ApiContext& ctx,
                  const RequestTemplate& t, ApiRequest* out, ApiError* error) {
  for (std::vector<int32_t>& prompt : *prompts) {
    const int mt = completion_length(static_cast<int>(prompt.size()), chat, ctx, t, error);
    if (mt < 0) return false;
    auto r = std::make_shared<Request>();
    r->prompt = std::move(prompt);
    r->sampling = t.sampling;
    r->max_tokens = mt;
    r->n = out->best_of;  // best_of candidates; the response keeps the n best (response_body)
    r->stop = t.stop;
    r->stop_strings = t.stop_strings;
    r->include_stop_str_in_output = t.include_stop;
    r->priority = t.priority;
    r->skip_special_tokens = t.skip_special;
    r->speculative = t.speculative;
    r->constraint = t.constraint;
    r->lora = out->lora;
    out->requests.push_back(std::move(r));
  }
  return true;
}

}  // namespace

bool parse_api_request(ApiEndpoint endpoint, std::string_view body, const ApiContext& ctx, ApiRequest* out,
                       ApiError* error) {
  if (endpoint == ApiEndpoint::kEmbeddings) return parse_embeddings_request(body, ctx, out, error);
  *out = ApiRequest();
  out->endpoint = endpoint;
  out->model = ctx.model_name;
  if (!ctx.generation) {
    *error = bad_request("", "this server only answers /v1/embeddings (server.task is embed)");
    return false;
  }
  nlohmann::ordered_json ordered;
  json j;
  if (!parse_body(body, &ordered, &j, error)) return false;
  const bool chat = endpoint == ApiEndpoint::kChatCompletions;
  FieldReader f(j, error);
  if (!check_model_and_fields(endpoint, j, ctx, f, out, error)) return false;

  // Field groups in a fixed order: the first invalid field is the one reported.
  RequestTemplate t;
  read_sampling_fields(f, &t.sampling);
  read_choice_fields(f, chat, ctx, out);
  if (!read_request_options(f, ctx, &t, out, error)) return false;
  read_max_tokens(f, chat, &t);
  read_logprobs(f, chat, out, &t.sampling);
  read_reasoning_fields(f, chat, out);
  if (!read_stop_fields(f, ctx, &t, error) || f.failed()) return false;
  std::optional<structured::RequestedConstraint> requested;
  if (!read_output_constraint(ordered, ctx, &requested, error)) return false;

  // The prompt before the grammar: what a reasoning model may think first depends on it.
  std::vector<std::vector<int32_t>> prompts;
  ForcedCall forced;
  if (chat ? !parse_messages(ordered, ctx, out, &prompts, &forced, error) : !parse_prompt(j, ctx, out, &prompts, error))
    return false;
  if (!compile_output_constraint(requested, ctx, *out, &t.constraint, error)) return false;
  if (!apply_tool_call_fields(ordered, j, ctx, *out, forced, &t, error)) return false;
  if (!apply_harmony_fields(ordered, j, *out, &t, error)) return false;
  return add_requests(&prompts, chat, ctx, t, out, error);
}

}  // namespace tessera
