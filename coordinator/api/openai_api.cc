#include "coordinator/api/openai_api.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "common/logging.h"
#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/api/response_json.h"
#include "coordinator/api/tool_calls/tool_call_stream.h"

namespace tessera {

using nlohmann::json;

namespace {

std::string token_text(const Tokenizer* tokenizer, int32_t id) {
  if (tokenizer == nullptr) return "token_id:" + std::to_string(id);
  const std::vector<int32_t> one{id};
  bool unstable = false;
  return tokenizer->decode_window(one, 0, 1, false, true, false, &unstable);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. With
// `prompt` (echo + logprobs) the prompt's tokens come first: the first with null logprob and
// top_logprobs (nothing precedes it), offsets counted from 0 over the prompt tokens' texts.
// The generated tokens' offsets start at *offset (the text before them: the echoed prompt,
// or what earlier stream chunks carried) and *offset moves past them.
json completion_logprobs(const std::vector<SampledToken>& tokens, const Tokenizer* tokenizer, size_t* offset,
                         const std::vector<int32_t>* prompt = nullptr,
                         const std::vector<PromptLogprob>* prompt_logprobs = nullptr) {
  json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
             {"text_offset", json::array()}};
  auto top_json = [&](const std::vector<TokenLogprob>& top) {
    json t = json::object();
    for (const TokenLogprob& a : top) t[token_text(tokenizer, a.token)] = a.logprob;
    return t;
  };
  if (prompt != nullptr) {
    size_t prompt_offset = 0;
    size_t next = 0;  // prompt_logprobs is in position order
    for (size_t p = 0; p < prompt->size(); ++p) {
      const std::string s = token_text(tokenizer, (*prompt)[p]);
      lp["tokens"].push_back(s);
      while (prompt_logprobs != nullptr && next < prompt_logprobs->size() &&
             (*prompt_logprobs)[next].position < static_cast<int32_t>(p))
        ++next;
      const PromptLogprob* scored = prompt_logprobs != nullptr && next < prompt_logprobs->size() &&
                                            (*prompt_logprobs)[next].position == static_cast<int32_t>(p)
                                        ? &(*prompt_logprobs)[next]
                                        : nullptr;
      lp["token_logprobs"].push_back(scored ? json(scored->logprob) : json(nullptr));
      lp["top_logprobs"].push_back(scored ? top_json(scored->top_logprobs) : json(nullptr));
      lp["text_offset"].push_back(prompt_offset);
      prompt_offset += s.size();
    }
  }
  for (const SampledToken& t : tokens) {
    const std::string s = token_text(tokenizer, t.token);
    lp["tokens"].push_back(s);
    lp["token_logprobs"].push_back(t.logprob);
    lp["top_logprobs"].push_back(top_json(t.top_logprobs));
    lp["text_offset"].push_back(*offset);
    *offset += s.size();
  }
  return lp;
}

// best_of > n: the n choices of each prompt with the highest cumulative logprob (the sum of
// their tokens' logprobs; ties keep the earlier choice), in that order. Else all, as generated.
std::vector<const ChoiceOutput*> returned_choices(const ApiRequest& request, const std::vector<ChoiceOutput>& choices) {
  std::vector<const ChoiceOutput*> out;
  const size_t gen = static_cast<size_t>(request.best_of);
  for (size_t first = 0; first < choices.size(); first += gen) {
    std::vector<std::pair<double, const ChoiceOutput*>> ranked;
    for (size_t c = first; c < std::min(first + gen, choices.size()); ++c) {
      double sum = 0;
      for (const SampledToken& t : choices[c].tokens) sum += t.logprob;
      ranked.emplace_back(sum, &choices[c]);
    }
    if (request.best_of > request.n) {
      std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      ranked.resize(std::min(ranked.size(), static_cast<size_t>(request.n)));
    }
    for (const auto& [sum, c] : ranked) out.push_back(c);
  }
  return out;
}

// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json chat_logprobs(const std::vector<SampledToken>& tokens, const Tokenizer* tokenizer) {
  json content = json::array();
  for (const SampledToken& t : tokens) {
    const std::string s = token_text(tokenizer, t.token);
    json top = json::array();
    for (const TokenLogprob& a : t.top_logprobs) {
      const std::string as = token_text(tokenizer, a.token);
      top.push_back({{"token", as}, {"logprob", a.logprob}, {"bytes", bytes_of(as)}});
    }
    content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json finish_json(FinishReason reason) {
  return reason == FinishReason::kNone ? json(nullptr) : json(api_finish_reason(reason));
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

bool is_chat(const ApiRequest& r) { return r.endpoint == ApiEndpoint::kChatCompletions; }

// One entry of "tool_calls": {id, type, function: {name, arguments}}; in a stream's first
// delta of a call also its index, with arguments "" (the next delta brings them).
json tool_call_json(const ToolCallDelta& d, bool with_arguments) {
  return {{"id", d.id},
          {"type", "function"},
          {"function", {{"name", d.call.name}, {"arguments", with_arguments ? d.call.arguments : std::string()}}}};
}

// A chat stream chunk of choice `index` with this delta.
std::string chat_chunk(const ApiRequest& request, const std::string& id, int64_t created, int index, json delta,
                       const std::vector<SampledToken>& tokens, json finish, const Tokenizer* tokenizer) {
  json choice = {{"index", index}, {"delta", std::move(delta)}};
  choice["logprobs"] = request.logprobs >= 0 && !tokens.empty() ? chat_logprobs(tokens, tokenizer) : json(nullptr);
  choice["finish_reason"] = std::move(finish);
  json out = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", request.model}};
  out["choices"] = json::array({std::move(choice)});
  if (request.include_usage) out["usage"] = nullptr;
  return response_json(out);
}

}  // namespace

const char* api_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

Usage usage_of(const ApiRequest& request, const std::vector<ChoiceOutput>& choices) {
  Usage u;
  for (const auto& r : request.requests) u.prompt_tokens += static_cast<int>(r->prompt.size());
  for (const auto& c : choices) u.completion_tokens += c.completion_tokens;
  return u;
}

std::string make_response_id(ApiEndpoint endpoint) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%016llx%04llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffff));
  const char* prefix = endpoint == ApiEndpoint::kChatCompletions ? "chatcmpl-"
                       : endpoint == ApiEndpoint::kEmbeddings    ? "embd-"
                                                                 : "cmpl-";
  return std::string(prefix) + buf;
}

bool ChoiceResults::add(size_t index, const GenerateEvent& ev) {
  if (index >= done.size() || done[index]) return false;
  ChoiceOutput& out = outputs[index];
  out.text += ev.text;
  out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
  if (!ev.prompt_logprobs.empty()) out.prompt_logprobs = ev.prompt_logprobs;
  out.completion_tokens = ev.completion_tokens;
  if (!ev.embedding.empty()) out.embedding = ev.embedding;
  if (!ev.finished) return true;
  out.finish_reason = ev.finish_reason;
  if (ev.finish_reason == FinishReason::kError && error.empty()) {
    error = ev.error.empty() ? "generation failed" : ev.error;
    unavailable = ev.unavailable;
  }
  if (ev.finish_reason == FinishReason::kAborted) cut = true;
  done[index] = 1;
  --remaining;
  return true;
}

std::string response_body(const ApiRequest& request, const std::string& id, int64_t created,
                          const std::vector<ChoiceOutput>& choices, const Tokenizer* tokenizer) {
  if (request.endpoint == ApiEndpoint::kEmbeddings) return embeddings_response_body(request, id, created, choices);
  const bool chat = is_chat(request);
  json out = {{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", request.model}};
  json list = json::array();
  const std::vector<const ChoiceOutput*> returned = returned_choices(request, choices);
  std::vector<ChoiceOutput> counted;  // what usage counts: the choices returned
  for (size_t i = 0; i < returned.size(); ++i) {
    const ChoiceOutput& c = *returned[i];
    const size_t prompt_index = i / static_cast<size_t>(request.n);
    json choice = {{"index", i}};
    json finish = finish_json(c.finish_reason);
    if (chat) {
      // A reasoning model's thoughts apart; an output cut inside them has no answer (null).
      std::optional<std::string> answer = c.text;
      if (request.reasoning) {
        SplitReasoning split = split_reasoning(c.text, request.starts_in_reasoning, request.reasoning_format);
        answer = std::move(split.content);
        choice["message"] = {{"role", "assistant"}, {"content", answer ? json(*answer) : json(nullptr)}};
        if (request.include_reasoning && split.reasoning) choice["message"]["reasoning_content"] = *split.reasoning;
      } else {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      }
      if (request.tool_call_parser && answer) {
        ParsedToolCalls parsed = parse_tool_calls(*request.tool_call_parser, *answer, request.parallel_tool_calls);
        if (!parsed.calls.empty()) {
          choice["message"]["content"] = parsed.content ? json(*parsed.content) : json(nullptr);
          json calls = json::array();
          for (const ToolCallDelta& d : parsed.calls) calls.push_back(tool_call_json(d, /*with_arguments=*/true));
          choice["message"]["tool_calls"] = std::move(calls);
          if (c.finish_reason == FinishReason::kStop) finish = "tool_calls";
        }
      }
      choice["logprobs"] = request.logprobs >= 0 ? chat_logprobs(c.tokens, tokenizer) : json(nullptr);
    } else {
      const std::string& prefix = request.echo ? request.prompt_texts[prompt_index] : std::string();
      choice["text"] = prefix + c.text;
      size_t offset = prefix.size();
      const bool with_prompt = request.echo && request.logprobs >= 0;
      choice["logprobs"] = request.logprobs >= 0
                               ? completion_logprobs(c.tokens, tokenizer, &offset,
                                                     with_prompt ? &request.requests[prompt_index]->prompt : nullptr,
                                                     &c.prompt_logprobs)
                               : json(nullptr);
    }
    choice["finish_reason"] = std::move(finish);
    list.push_back(std::move(choice));
    counted.push_back(c);
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage_of(request, counted));
  return response_json(out);
}

std::string stream_chunk_body(const ApiRequest& request, const std::string& id, int64_t created, int index,
                              const std::string& text, const std::vector<SampledToken>& tokens,
                              FinishReason finish_reason, bool role_only, const Tokenizer* tokenizer,
                              size_t* text_offset) {
  size_t local_offset = 0;
  if (text_offset == nullptr) text_offset = &local_offset;
  const bool chat = is_chat(request);
  json out = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", request.model}};
  json choice = {{"index", index}};
  if (chat) {
    if (role_only)
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    else if (text.empty() && finish_reason != FinishReason::kNone)
      choice["delta"] = json::object();
    else
      choice["delta"] = {{"content", text}};
    choice["logprobs"] =
        request.logprobs >= 0 && !tokens.empty() ? chat_logprobs(tokens, tokenizer) : json(nullptr);
  } else {
    choice["text"] = text;
    choice["logprobs"] =
        request.logprobs >= 0 && !tokens.empty() ? completion_logprobs(tokens, tokenizer, text_offset) : json(nullptr);
  }
  choice["finish_reason"] = finish_json(finish_reason);
  out["choices"] = json::array({std::move(choice)});
  if (request.include_usage) out["usage"] = nullptr;
  return response_json(out);
}

std::vector<std::string> stream_event_chunks(const ApiRequest& request, const std::string& id, int64_t created,
                                             int index, const GenerateEvent& ev, const Tokenizer* tokenizer,
                                             ChoiceOutput* out) {
  const FinishReason finish = ev.finished ? ev.finish_reason : FinishReason::kNone;
  if (!request.tool_call_parser && !request.reasoning) {
    if (ev.text.empty() && !ev.finished && (request.logprobs < 0 || ev.tokens.empty())) return {};
    return {stream_chunk_body(request, id, created, index, ev.text, ev.tokens, finish, false, tokenizer,
                              &out->stream_text_offset)};
  }
  // Tokens whose text is held back wait for the next chunk, so every token's logprobs are sent once.
  out->stream_held_tokens.insert(out->stream_held_tokens.end(), ev.tokens.begin(), ev.tokens.end());
  std::vector<std::string> chunks;
  auto take_tokens = [&]() { return std::exchange(out->stream_held_tokens, {}); };
  // A reasoning model's thoughts first, as reasoning_content deltas; the answer goes on below.
  std::string answer = ev.text;
  if (request.reasoning) {
    if (!out->reasoning_stream) out->reasoning_stream = std::make_shared<ReasoningStream>(request.starts_in_reasoning, request.reasoning_format);
    ReasoningDelta split = out->reasoning_stream->feed(ev.text, /*last=*/ev.finished);
    if (request.include_reasoning && !split.reasoning.empty())
      chunks.push_back(chat_chunk(request, id, created, index, {{"reasoning_content", split.reasoning}}, take_tokens(),
                                  nullptr, tokenizer));
    answer = std::move(split.content);
  }
  if (!request.tool_call_parser) {
    if (!answer.empty())
      chunks.push_back(chat_chunk(request, id, created, index, {{"content", answer}}, take_tokens(), nullptr, tokenizer));
    if (ev.finished)
      chunks.push_back(chat_chunk(request, id, created, index, json::object(), take_tokens(), finish_json(finish),
                                  tokenizer));
    return chunks;
  }
  if (!out->tool_stream)
    out->tool_stream = std::make_shared<ToolCallStream>(request.tool_call_parser.get(), request.parallel_tool_calls);
  ToolCallStream& stream = *out->tool_stream;
  std::vector<ToolCallDelta> deltas = stream.feed(answer);
  if (ev.finished)
    for (ToolCallDelta& d : stream.finish()) deltas.push_back(std::move(d));
  for (const ToolCallDelta& d : deltas) {
    if (!d.is_call) {
      chunks.push_back(chat_chunk(request, id, created, index, {{"content", d.content}}, take_tokens(), nullptr,
                                  tokenizer));
      continue;
    }
    json first = tool_call_json(d, /*with_arguments=*/false);
    first["index"] = d.index;
    chunks.push_back(chat_chunk(request, id, created, index, {{"tool_calls", json::array({first})}}, take_tokens(),
                                nullptr, tokenizer));
    json args = {{"index", d.index}, {"function", {{"arguments", d.call.arguments}}}};
    chunks.push_back(
        chat_chunk(request, id, created, index, {{"tool_calls", json::array({args})}}, {}, nullptr, tokenizer));
  }
  if (ev.finished) {
    json reason = stream.num_calls() > 0 && finish == FinishReason::kStop ? json("tool_calls") : finish_json(finish);
    chunks.push_back(chat_chunk(request, id, created, index, json::object(), take_tokens(), std::move(reason),
                                tokenizer));
  }
  return chunks;
}

std::string stream_echo_body(const ApiRequest& request, const std::string& id, int64_t created, int index,
                             const std::vector<PromptLogprob>& prompt_logprobs, const Tokenizer* tokenizer,
                             size_t* text_offset) {
  const size_t prompt_index = static_cast<size_t>(index) / static_cast<size_t>(request.n);
  const std::string& text = request.prompt_texts[prompt_index];
  json choice = {{"index", index}, {"text", text}};
  size_t unused = 0;
  choice["logprobs"] = request.logprobs >= 0 ? completion_logprobs({}, tokenizer, &unused,
                                                                   &request.requests[prompt_index]->prompt,
                                                                   &prompt_logprobs)
                                             : json(nullptr);
  choice["finish_reason"] = nullptr;
  if (text_offset != nullptr) *text_offset = text.size();  // generated tokens' offsets follow the echo
  json out = {{"id", id},
              {"object", "text_completion"},
              {"created", created},
              {"model", request.model},
              {"choices", json::array({std::move(choice)})}};
  if (request.include_usage) out["usage"] = nullptr;
  return response_json(out);
}

std::string stream_usage_body(const ApiRequest& request, const std::string& id, int64_t created,
                              const Usage& usage) {
  json out = {{"id", id},
              {"object", is_chat(request) ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", request.model},
              {"choices", json::array()},
              {"usage", usage_json(usage)}};
  return response_json(out);
}

nlohmann::json model_card(const std::string& model_name, int max_model_len, int64_t created, const std::string& adapter,
                          const std::string& adapter_path) {
  if (adapter.empty()) {
    return {{"id", model_name},      {"object", "model"},  {"created", created},
            {"owned_by", "tessera"}, {"root", model_name}, {"parent", nullptr},
            {"max_model_len", max_model_len}};
  }
  return {{"id", adapter},         {"object", "model"},    {"created", created},
          {"owned_by", "tessera"}, {"root", adapter_path}, {"parent", model_name},
          {"max_model_len", max_model_len}};
}

std::string models_body(const ApiContext& ctx, int64_t created) {
  json data = json::array({model_card(ctx.model_name, ctx.max_model_len, created)});
  for (const auto& [name, path] : ctx.lora_adapters->snapshot())
    data.push_back(model_card(ctx.model_name, ctx.max_model_len, created, name, path));
  return response_json(json{{"object", "list"}, {"data", data}});
}

std::string sse_event(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

ApiContext make_api_context(const Tokenizer* tokenizer, std::string model_name, int max_model_len,
                            ChatRenderer renderer, std::optional<ToolCallFormat> tool_calls,
                            std::optional<ReasoningFormat> reasoning) {
  ApiContext api;
  api.tokenizer = tokenizer;
  if (tokenizer != nullptr) api.token_vocabulary = structured::TokenVocabulary::from_tokenizer(*tokenizer);
  api.model_name = std::move(model_name);
  api.max_model_len = max_model_len;
  api.chat_renderer = std::move(renderer);
  std::string template_source;
  if (!api.chat_renderer && tokenizer != nullptr) {
    // The tokenizer's own chat template (or the documented built-in when it has none).
    StatusOr<ChatTemplate> tmpl = ChatTemplate::for_tokenizer(*tokenizer);
    if (tmpl.is_ok()) {
      auto shared = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
      template_source = shared->source();
      api.chat_renderer = [shared](const nlohmann::ordered_json& context) { return shared->render(context); };
    } else {
      // Never a made-up prompt: every chat request is refused with the template's error.
      TESSERA_LOG_ERROR("[coord] the model's chat template is unusable ({}); chat requests get 500",
                        tmpl.status().to_string());
      const Status st = internal_error(tmpl.status().message());
      api.chat_renderer = [st](const nlohmann::ordered_json&) -> StatusOr<std::string> { return st; };
    }
  }
  api.reasoning = reasoning ? *reasoning : reasoning_format_for_template(template_source);
  const ToolCallFormat format = tool_calls ? *tool_calls : tool_call_format_for_template(template_source);
  api.tool_call_parser = make_tool_call_parser(format);
  api.tool_call_format = format;
  api.tool_call_vocabulary = api.token_vocabulary;
  if (api.tool_call_parser && tokenizer != nullptr && !api.tool_call_parser->special_marker().empty()) {
    const std::string marker(api.tool_call_parser->special_marker());
    const int32_t id = tokenizer->token_to_id(marker);
    // Without such a special token the marker is ordinary text, which the vocabulary spells.
    if (id >= 0 && tokenizer->is_special(id))
      api.tool_call_vocabulary = api.token_vocabulary->with_token_bytes(id, marker);
  }
  return api;
}

}  // namespace tessera
