// libFuzzer: the OpenAI request decoder (coordinator/api/openai_api.h) on arbitrary bytes as the
// request body, for both endpoints, with the kjv-llama tokenizer and its chat template (as
// tessera-serve runs it); then the JSON writers on a dummy output of every decoded request.
//
// Invariants (a violation traps, so libFuzzer reports it with the input):
//  - success: one Request per prompt (each with n choices), every prompt non-empty with ids in
//    [0, vocab), 1 <= max_tokens and prompt + max_tokens <= max_model_len;
//  - failure: an HTTP status in 400..499 and a non-empty message;
//  - every JSON writer (responses, stream chunks, usage, errors) emits valid JSON;
//  - the Batch API's multipart/form-data reader (coordinator/api/multipart_form.h), given the
//    input's first line as the Content-Type and the rest as the body, either refuses with a
//    message or returns named parts whose bytes lie within the body.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/api/chat_template.h"
#include "coordinator/api/multipart_form.h"
#include "coordinator/api/openai_api.h"

namespace tessera {
namespace {

constexpr int kMaxModelLen = 256;

#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "api_request_fuzzer: invariant failed: %s (%s:%d)\n", #cond, \
                   __FILE__, __LINE__);                                               \
      __builtin_trap();                                                               \
    }                                                                                 \
  } while (0)

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const ChatTemplate> chat_template;
  ApiContext with_tokenizer;   // tokenizer + the model's chat template (null tokenizer if absent)
  ApiContext no_template;      // tokenizer, no chat renderer: chat requests are a 500, never a made-up prompt
  ApiContext token_ids_only;   // no tokenizer at all
};

std::string fixtures_dir() {
  const char* env = std::getenv("TESSERA_FIXTURES");
  return env != nullptr && *env != '\0' ? env : TESSERA_FIXTURES_DIR;
}

Fixture* make_fixture() {
  init_logging("fuzz", spdlog::level::err);
  auto* f = new Fixture();
  const std::string dir = fixtures_dir() + "/kjv-llama";
  if (auto t = Tokenizer::load(dir); t.is_ok()) {
    f->tokenizer = std::move(t).value();
    if (auto tmpl = ChatTemplate::for_tokenizer(*f->tokenizer); tmpl.is_ok())
      f->chat_template = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
  } else {
    std::fprintf(stderr,
                 "api_request_fuzzer: no tokenizer at %s (%s); fuzzing token-id prompts only "
                 "(set TESSERA_FIXTURES to the fixtures folder)\n",
                 dir.c_str(), t.status().to_string().c_str());
  }
  for (ApiContext* c : {&f->with_tokenizer, &f->no_template, &f->token_ids_only}) {
    c->model_name = "kjv-llama";
    c->max_model_len = kMaxModelLen;
  }
  f->with_tokenizer.tokenizer = f->tokenizer.get();
  f->no_template.tokenizer = f->tokenizer.get();
  if (f->chat_template) {
    auto tmpl = f->chat_template;
    f->with_tokenizer.chat_renderer = [tmpl](const nlohmann::ordered_json& c) { return tmpl->render(c); };
    // Requests with tools have their outputs read for Hermes calls (stream and whole).
    f->with_tokenizer.tool_call_parser = make_tool_call_parser(ToolCallFormat::kHermes);
  }
  return f;
}

const Fixture& fixture() {
  static const Fixture* f = make_fixture();
  return *f;
}

void check_json(const std::string& text) { FUZZ_CHECK(nlohmann::json::accept(text)); }

// A dummy output for each choice: text and token ids taken from the input bytes (any id in
// the vocabulary, special tokens included), with as many alternatives as were asked for.
void exercise_writers(const ApiRequest& r, const ApiContext& ctx, std::string_view data) {
  const int64_t vocab = ctx.tokenizer != nullptr ? ctx.tokenizer->vocab_size() : 1000;
  std::vector<ChoiceOutput> choices(r.num_choices());
  for (size_t i = 0; i < choices.size() && i < 8; ++i) {
    ChoiceOutput& c = choices[i];
    c.text = std::string(data.substr(0, std::min<size_t>(data.size(), 16 * (i + 1))));
    for (size_t k = 0; k < 4 && k < data.size(); ++k) {
      SampledToken t;
      t.token = static_cast<int32_t>((static_cast<unsigned char>(data[k]) * 131 + i * 17 + k) % vocab);
      t.logprob = -0.25f * static_cast<float>(k);
      for (int a = 0; a < r.logprobs; ++a)
        t.top_logprobs.push_back({static_cast<int32_t>((t.token + 1 + a) % vocab), -1.0f - a});
      c.tokens.push_back(std::move(t));
    }
    c.completion_tokens = static_cast<int>(c.tokens.size());
    c.finish_reason = i % 2 == 0 ? FinishReason::kLength : FinishReason::kStop;
  }
  const std::string id = make_response_id(r.endpoint);
  check_json(response_body(r, id, 1700000000, choices, ctx.tokenizer));
  const size_t n = std::min<size_t>(choices.size(), 4);
  for (size_t i = 0; i < n; ++i) {
    const ChoiceOutput& c = choices[i];
    const int index = static_cast<int>(i);
    check_json(stream_chunk_body(r, id, 1700000000, index, "", {}, FinishReason::kNone, /*role_only=*/true, ctx.tokenizer));
    check_json(stream_chunk_body(r, id, 1700000000, index, c.text, c.tokens, FinishReason::kNone, false, ctx.tokenizer));
    check_json(stream_chunk_body(r, id, 1700000000, index, "", {}, c.finish_reason, false, ctx.tokenizer));
    if (r.endpoint == ApiEndpoint::kChatCompletions) {
      // The text in two pieces, split where the input says, through the stream's chunking.
      ChoiceOutput state;
      const size_t cut = data.empty() ? 0 : static_cast<unsigned char>(data[0]) % (c.text.size() + 1);
      GenerateEvent first, last;
      first.text = c.text.substr(0, cut);
      first.tokens = c.tokens;
      last.text = c.text.substr(cut);
      last.finished = true;
      last.finish_reason = c.finish_reason;
      for (const std::string& chunk : stream_event_chunks(r, id, 1700000000, index, first, ctx.tokenizer, &state))
        check_json(chunk);
      for (const std::string& chunk : stream_event_chunks(r, id, 1700000000, index, last, ctx.tokenizer, &state))
        check_json(chunk);
    }
    if (r.echo) check_json(stream_chunk_body(r, id, 1700000000, index, r.prompt_texts[i / r.n], {}, FinishReason::kNone, false,
                                             ctx.tokenizer));
  }
  check_json(stream_usage_body(r, id, 1700000000, usage_of(r, choices)));
}

void run_one(ApiEndpoint endpoint, const ApiContext& ctx, std::string_view body) {
  ApiRequest r;
  ApiError e;
  if (!parse_api_request(endpoint, body, ctx, &r, &e)) {
    // A 500 only where the server has no chat template to render with.
    FUZZ_CHECK((e.http_status >= 400 && e.http_status <= 499) || (e.http_status == 500 && !ctx.chat_renderer));
    FUZZ_CHECK(!e.message.empty());
    check_json(error_body(e));
    return;
  }
  FUZZ_CHECK(r.endpoint == endpoint);
  FUZZ_CHECK(r.n >= 1 && r.n <= 128);
  FUZZ_CHECK(r.logprobs >= -1 && r.logprobs <= 20);
  FUZZ_CHECK(!r.requests.empty());
  FUZZ_CHECK(r.prompt_texts.size() == r.requests.size());
  FUZZ_CHECK(r.num_choices() == r.requests.size() * static_cast<size_t>(r.n));
  const int64_t vocab = ctx.tokenizer != nullptr ? ctx.tokenizer->vocab_size() : int64_t{INT32_MAX};
  for (const auto& request : r.requests) {
    const Request& g = *request;
    FUZZ_CHECK(g.n == r.n);
    FUZZ_CHECK(!g.prompt.empty());
    for (int32_t id : g.prompt) FUZZ_CHECK(id >= 0 && id < vocab);
    for (int32_t id : g.stop.stop_token_ids) FUZZ_CHECK(id >= 0 && id < vocab);
    FUZZ_CHECK(g.max_tokens >= 1);
    FUZZ_CHECK(static_cast<int64_t>(g.prompt.size()) + g.max_tokens <= ctx.max_model_len);
    FUZZ_CHECK(g.sampling.logprobs == (r.logprobs >= 0 ? r.logprobs : g.sampling.logprobs));
    for (const std::string& s : g.stop_strings) FUZZ_CHECK(!s.empty());
  }
  exercise_writers(r, ctx, body);
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const Fixture& f = fixture();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  run_one(ApiEndpoint::kCompletions, f.with_tokenizer, body);
  run_one(ApiEndpoint::kChatCompletions, f.with_tokenizer, body);
  if (f.tokenizer) {
    run_one(ApiEndpoint::kChatCompletions, f.no_template, body);
    run_one(ApiEndpoint::kCompletions, f.token_ids_only, body);
  }
  const size_t line_end = std::min(body.find('\n'), body.size());
  const std::string_view form = body.substr(std::min(line_end + 1, body.size()));
  StatusOr<std::map<std::string, FormPart>> parts = parse_multipart_form(body.substr(0, line_end), form);
  if (!parts.is_ok()) {
    FUZZ_CHECK(!parts.status().message().empty());
  } else {
    for (const auto& [name, part] : *parts) {
      FUZZ_CHECK(!name.empty());
      FUZZ_CHECK(part.content.size() <= form.size());
    }
  }
  return 0;
}
