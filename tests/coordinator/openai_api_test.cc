// Request decoding (every field, every error naming its field) and response JSON of the
// OpenAI-compatible layer, without any transport.
#include "coordinator/api/openai_api.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>

#include "coordinator/api/chat_template.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using nlohmann::json;

ApiContext ids_only_context() {
  ApiContext c;
  c.model_name = "m";
  c.max_model_len = 64;
  return c;
}

// Parses `body` expecting failure; returns the error.
ApiError expect_error(const std::string& body, ApiEndpoint ep = ApiEndpoint::kCompletions,
                      const ApiContext& ctx = ids_only_context()) {
  ApiRequest req;
  ApiError err;
  EXPECT_FALSE(parse_api_request(ep, body, ctx, &req, &err)) << body;
  return err;
}

ApiRequest expect_ok(const std::string& body, ApiEndpoint ep = ApiEndpoint::kCompletions,
                     const ApiContext& ctx = ids_only_context()) {
  ApiRequest req;
  ApiError err;
  EXPECT_TRUE(parse_api_request(ep, body, ctx, &req, &err)) << body << " -> " << err.message;
  return req;
}

TEST(OpenAiApi, DefaultsForTokenIdPrompt) {
  ApiRequest r = expect_ok(R"({"prompt": [5, 6, 7]})");
  ASSERT_EQ(r.requests.size(), 1u);
  EXPECT_EQ(r.requests[0]->prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.requests[0]->max_tokens, 16);
  EXPECT_EQ(r.requests[0]->sampling.temperature, 0.0f);
  EXPECT_FALSE(r.requests[0]->sampling.seed.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_EQ(r.model, "m");
}

TEST(OpenAiApi, EveryCompletionField) {
  ApiRequest r = expect_ok(R"({"model": "m", "prompt": [1, 2], "max_tokens": 7, "temperature": 0.7,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "stop": ["x", "yz"], "seed": 11, "n": 3,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "logprobs": 2,
      "echo": true, "stream": true, "stream_options": {"include_usage": true}, "user": "u1",
      "ignore_eos": true, "stop_token_ids": [9], "skip_special_tokens": false})");
  ASSERT_EQ(r.requests.size(), 1u);  // one prompt; its 3 choices fork in the engine
  ASSERT_EQ(r.num_choices(), 3u);
  EXPECT_EQ(r.requests[0]->n, 3);
  const Request& g = *r.requests[0];
  EXPECT_EQ(g.max_tokens, 7);
  EXPECT_EQ(g.stop_strings, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(g.stop.ignore_eos);
  EXPECT_EQ(g.stop.stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_FALSE(g.skip_special_tokens);
  for (int i = 0; i < 3; ++i) {
    const SamplingParams sampling = g.choice_sampling(i);  // what choice i draws with
    EXPECT_FLOAT_EQ(sampling.temperature, 0.7f);
    EXPECT_FLOAT_EQ(sampling.top_p, 0.9f);
    EXPECT_EQ(sampling.top_k, 40);
    EXPECT_FLOAT_EQ(sampling.min_p, 0.05f);
    EXPECT_FLOAT_EQ(sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(sampling.frequency_penalty, -0.5f);
    EXPECT_FLOAT_EQ(sampling.repetition_penalty, 1.2f);
    EXPECT_EQ(sampling.logprobs, 2);
    ASSERT_TRUE(sampling.seed.has_value());
    EXPECT_EQ(*sampling.seed, 11u + i);  // n > 1: seed + i
  }
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.user, "u1");
}

TEST(OpenAiApi, StopAsStringTopKMinusOneAndNulls) {
  ApiRequest r = expect_ok(R"({"prompt": [1], "stop": "END", "top_k": -1, "temperature": null, "seed": null})");
  EXPECT_EQ(r.requests[0]->stop_strings, (std::vector<std::string>{"END"}));
  EXPECT_EQ(r.requests[0]->sampling.top_k, 0);
  EXPECT_FALSE(r.requests[0]->sampling.seed.has_value());
}

TEST(OpenAiApi, BatchOfTokenIdPromptsWithN) {
  ApiRequest r = expect_ok(R"({"prompt": [[1, 2], [3]], "n": 2})");
  ASSERT_EQ(r.num_choices(), 4u);  // prompt-major: index = prompt * n + i
  ASSERT_EQ(r.requests.size(), 2u);
  EXPECT_EQ(r.requests[0]->prompt, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.requests[0]->n, 2);
  EXPECT_EQ(r.requests[1]->prompt, (std::vector<int32_t>{3}));
  EXPECT_EQ(r.requests[1]->n, 2);
  std::vector<ChoiceOutput> outs(4);
  for (auto& o : outs) o.completion_tokens = 2;
  Usage u = usage_of(r, outs);
  EXPECT_EQ(u.prompt_tokens, 3);  // each prompt once
  EXPECT_EQ(u.completion_tokens, 8);
}

struct ErrorCase {
  const char* body;
  const char* param;
};

TEST(OpenAiApi, TypeAndRangeErrorsNameTheField) {
  const ErrorCase cases[] = {
      {R"({"prompt": [1], "temperature": "hot"})", "temperature"},
      {R"({"prompt": [1], "temperature": 3})", "temperature"},
      {R"({"prompt": [1], "top_p": 0})", "top_p"},
      {R"({"prompt": [1], "top_p": true})", "top_p"},
      {R"({"prompt": [1], "top_k": 1.5})", "top_k"},
      {R"({"prompt": [1], "top_k": -2})", "top_k"},
      {R"({"prompt": [1], "min_p": 2})", "min_p"},
      {R"({"prompt": [1], "presence_penalty": "a"})", "presence_penalty"},
      {R"({"prompt": [1], "frequency_penalty": 5})", "frequency_penalty"},
      {R"({"prompt": [1], "repetition_penalty": 0})", "repetition_penalty"},
      {R"({"prompt": [1], "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": [1], "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": [1], "n": 0})", "n"},
      {R"({"prompt": [1], "n": "2"})", "n"},
      {R"({"prompt": [1], "seed": 1.5})", "seed"},
      {R"({"prompt": [1], "stream": "yes"})", "stream"},
      {R"({"prompt": [1], "stream_options": 1})", "stream_options"},
      {R"({"prompt": [1], "stream_options": {"include_usage": 1}})", "stream_options.include_usage"},
      {R"({"prompt": [1], "logprobs": 21})", "logprobs"},
      {R"({"prompt": [1], "logprobs": true})", "logprobs"},
      {R"({"prompt": [1], "echo": 1})", "echo"},
      {R"({"prompt": [1], "stop": 5})", "stop"},
      {R"({"prompt": [1], "stop": ["a", 1]})", "stop"},
      {R"({"prompt": [1], "user": 5})", "user"},
      {R"({"prompt": [1], "model": 5})", "model"},
      {R"({"prompt": [1], "ignore_eos": "no"})", "ignore_eos"},
      {R"({"prompt": [1], "stop_token_ids": ["a"]})", "stop_token_ids"},
      {R"({"prompt": [1], "stop_token_ids": [-1]})", "stop_token_ids"},
      {R"({"prompt": [1], "skip_special_tokens": 0})", "skip_special_tokens"},
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [-3]})", "prompt"},
      {R"({"prompt": [[1], []]})", "prompt[1]"},
      {R"({"prompt": [[1], [2, "x"]]})", "prompt[1]"},
      {R"({"prompt": "text needs a tokenizer"})", "prompt"},
  };
  for (const ErrorCase& c : cases) {
    ApiError e = expect_error(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(OpenAiApi, InvalidJsonAndNonObject) {
  EXPECT_EQ(expect_error("{not json").http_status, 400);
  EXPECT_EQ(expect_error("[1, 2]").http_status, 400);
  EXPECT_NE(expect_error("{not json").message.find("JSON"), std::string::npos);
}

TEST(OpenAiApi, UnknownModelIs404) {
  ApiError e = expect_error(R"({"model": "other", "prompt": [1]})");
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_NE(e.message.find("other"), std::string::npos);
}

TEST(OpenAiApi, ContextLengthErrorHasBothNumbers) {
  ApiError e = expect_error(R"({"prompt": [1, 2, 3, 4], "max_tokens": 61})");  // 4 + 61 > 64
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("64"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("65"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("4 in the prompt"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("61 in the completion"), std::string::npos) << e.message;
  expect_ok(R"({"prompt": [1, 2, 3, 4], "max_tokens": 60})");
  std::string long_prompt = "[";
  for (int i = 0; i < 64; ++i) long_prompt += (i ? ",1" : "1");
  long_prompt += "]";
  EXPECT_EQ(expect_error(R"({"prompt": )" + long_prompt + "}").param, "prompt");
}

TEST(OpenAiApi, ErrorBodyShape) {
  ApiError e = bad_request("temperature", "'temperature' must be a number");
  json j = json::parse(error_body(e));
  EXPECT_EQ(j["error"]["message"], "'temperature' must be a number");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());
  e.param.clear();
  EXPECT_TRUE(json::parse(error_body(e))["error"]["param"].is_null());
}

TEST(OpenAiApi, CompletionResponseAndChunks) {
  ApiRequest r = expect_ok(R"({"prompt": [1, 2], "n": 2, "logprobs": 1, "stream_options": {"include_usage": true}})");
  std::vector<ChoiceOutput> outs(2);
  outs[0].text = "ab";
  outs[0].finish_reason = FinishReason::kLength;
  outs[0].completion_tokens = 2;
  SampledToken t;
  t.token = 7;
  t.logprob = -0.25f;
  t.top_logprobs = {{7, -0.25f}};
  outs[0].tokens = {t, t};
  outs[1].text = "c";
  outs[1].finish_reason = FinishReason::kStop;
  outs[1].completion_tokens = 1;
  outs[1].tokens = {t};
  json j = json::parse(response_body(r, "cmpl-1", 123, outs, nullptr));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["created"], 123);
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"][0], "token_id:7");
  EXPECT_FLOAT_EQ(j["choices"][0]["logprobs"]["token_logprobs"][1].get<float>(), -0.25f);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 5);

  json c = json::parse(stream_chunk_body(r, "cmpl-1", 123, 1, "x", {}, FinishReason::kNone, false, nullptr));
  EXPECT_EQ(c["choices"][0]["index"], 1);
  EXPECT_EQ(c["choices"][0]["text"], "x");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
  json u = json::parse(stream_usage_body(r, "cmpl-1", 123, Usage{2, 3}));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 5);
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
}

TEST(OpenAiApi, ModelsBody) {
  ApiContext ctx;
  ctx.model_name = "kjv";
  ctx.max_model_len = 512;
  json j = json::parse(models_body(ctx, 5));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "kjv");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_TRUE(j["data"][0]["parent"].is_null());
}

TEST(OpenAiApi, ModelsBodyListsEachAdapterWithTheModelAsParent) {
  ApiContext ctx;
  ctx.model_name = "kjv";
  ctx.lora_adapters = std::make_shared<ServedLoras>(
      std::map<std::string, std::string>{{"psalms", "/adapters/psalms"}, {"proverbs", "/adapters/proverbs"}});
  json j = json::parse(models_body(ctx, 5));
  ASSERT_EQ(j["data"].size(), 3u);
  EXPECT_EQ(j["data"][0]["id"], "kjv");
  for (int i : {1, 2}) {
    EXPECT_EQ(j["data"][i]["parent"], "kjv");
    EXPECT_EQ(j["data"][i]["root"], "/adapters/" + j["data"][i]["id"].get<std::string>());
  }
}

TEST(OpenAiApi, ModelPicksTheAdapterItNamesAndUnknownNamesAre404) {
  ApiContext ctx;
  ctx.model_name = "kjv";
  ctx.lora_adapters = std::make_shared<ServedLoras>(std::map<std::string, std::string>{{"psalms", "/adapters/psalms"}});
  ApiRequest req;
  ApiError err;
  ASSERT_TRUE(parse_api_request(ApiEndpoint::kCompletions, R"({"model":"psalms","prompt":[1,2,3]})", ctx, &req, &err))
      << err.message;
  EXPECT_EQ(req.model, "psalms");
  ASSERT_EQ(req.requests.size(), 1u);
  EXPECT_EQ(req.requests[0]->lora, "psalms");
  ASSERT_TRUE(parse_api_request(ApiEndpoint::kCompletions, R"({"model":"kjv","prompt":[1,2,3]})", ctx, &req, &err));
  EXPECT_EQ(req.requests[0]->lora, "");
  EXPECT_FALSE(parse_api_request(ApiEndpoint::kCompletions, R"({"model":"proverbs","prompt":[1,2,3]})", ctx, &req, &err));
  EXPECT_EQ(err.http_status, 404);
  EXPECT_EQ(err.code, "model_not_found");
  EXPECT_NE(err.message.find("'psalms'"), std::string::npos) << err.message;
}

TEST(OpenAiApi, ResponseIdsAreDistinct) {
  const std::string a = make_response_id(ApiEndpoint::kCompletions);
  const std::string b = make_response_id(ApiEndpoint::kCompletions);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(make_response_id(ApiEndpoint::kChatCompletions).rfind("chatcmpl-", 0), 0u);
}

// ---- with the kjv-llama tokenizer ----------------------------------------------------------

class OpenAiApiTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto t = Tokenizer::load(::tessera::testing::fixtures_dir() + "/kjv-llama");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tokenizer_ = std::move(t).value();
    ctx_.tokenizer = tokenizer_.get();
    ctx_.model_name = "kjv";
    ctx_.max_model_len = 512;
    ctx_.chat_renderer = make_api_context(tokenizer_.get(), "kjv", 512, nullptr).chat_renderer;
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  ApiContext ctx_;
};

TEST_F(OpenAiApiTokenizer, TextPromptsAreTokenizedWithBos) {
  ApiRequest r = expect_ok(R"({"prompt": "In the beginning"})", ApiEndpoint::kCompletions, ctx_);
  EXPECT_EQ(r.requests[0]->prompt, tokenizer_->encode("In the beginning", true));
  EXPECT_EQ(r.requests[0]->prompt.front(), tokenizer_->bos_id());
  ASSERT_TRUE(r.requests[0]->stop.eos_token_id.has_value());
  EXPECT_EQ(*r.requests[0]->stop.eos_token_id, tokenizer_->eos_id());
  ApiRequest b = expect_ok(R"({"prompt": ["a", "b c"]})", ApiEndpoint::kCompletions, ctx_);
  ASSERT_EQ(b.requests.size(), 2u);
  EXPECT_EQ(b.prompt_texts[1], "b c");
  EXPECT_EQ(expect_error(R"({"prompt": [5000]})", ApiEndpoint::kCompletions, ctx_).param, "prompt");
}

TEST_F(OpenAiApiTokenizer, ChatMessages) {
  ApiRequest r = expect_ok(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
          "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2})",
      ApiEndpoint::kChatCompletions, ctx_);
  // The model's own chat template (kjv-llama: BOS, then the system text + " ", then the rest),
  // never a join of the contents; the rendered text is tokenized with no special tokens added.
  EXPECT_EQ(r.requests[0]->prompt, tokenizer_->encode("<s>Be brief. Hi", false));
  EXPECT_EQ(r.requests[0]->max_tokens, 5);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.requests[0]->sampling.logprobs, 2);
  // Without max_tokens, chat may use the rest of the context.
  ApiRequest d = expect_ok(R"({"messages": [{"role": "user", "content": "Hi"}]})", ApiEndpoint::kChatCompletions, ctx_);
  EXPECT_EQ(d.requests[0]->max_tokens, 512 - static_cast<int>(d.requests[0]->prompt.size()));

  ApiContext with_template = ctx_;
  with_template.chat_renderer = [](const nlohmann::ordered_json& c) -> StatusOr<std::string> {
    const auto& m = c["messages"].back();
    return "<s>" + m["role"].get<std::string>() + ":" + m["content"].get<std::string>();
  };
  ApiRequest t = expect_ok(R"({"messages": [{"role": "user", "content": "Hi"}]})", ApiEndpoint::kChatCompletions,
                           with_template);
  EXPECT_EQ(t.requests[0]->prompt, tokenizer_->encode("<s>user:Hi", false));

  const ErrorCase cases[] = {
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [5]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "user"}]})", "messages[1].content"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
       "messages[0].content[0].text"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": "a"})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 600})", "max_tokens"},
  };
  for (const ErrorCase& c : cases) {
    ApiError e = expect_error(c.body, ApiEndpoint::kChatCompletions, ctx_);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
  }
}

// chat_template_kwargs reach the template as variables (DeepSeek-V3.1's real template from the
// fixtures' corpus reads "thinking" / "enable_thinking" to leave its think block open); a name
// the template never reads, one the request sets itself, or a non-object is a 400 naming it.
TEST_F(OpenAiApiTokenizer, ChatTemplateKwargsReachTheTemplateAndUnreadOnesAreRefused) {
  const auto corpus = nlohmann::ordered_json::parse(
      ::tessera::testing::read_file(::tessera::testing::fixtures_dir() + "/chat_templates/templates/deepseek-v3.1.json"));
  auto parsed = ChatTemplate::parse(corpus["template"].get<std::string>());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  auto tmpl = std::make_shared<const ChatTemplate>(std::move(parsed).value());
  ApiContext ctx = ctx_;
  std::vector<std::string> rendered;
  ctx.chat_renderer = [tmpl, &rendered](const nlohmann::ordered_json& c) -> StatusOr<std::string> {
    StatusOr<std::string> text = tmpl->render(c);
    if (text.is_ok()) rendered.push_back(*text);
    return text;
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "Why?"}])";
  expect_ok("{" + messages + "}", ApiEndpoint::kChatCompletions, ctx);
  expect_ok("{" + messages + R"(, "chat_template_kwargs": {"thinking": true}})", ApiEndpoint::kChatCompletions, ctx);
  expect_ok("{" + messages + R"(, "chat_template_kwargs": {"enable_thinking": true}})", ApiEndpoint::kChatCompletions,
            ctx);
  ASSERT_EQ(rendered.size(), 3u);
  // (DeepSeek's markers hold U+FF5C, the fullwidth vertical line.)
  EXPECT_TRUE(rendered[0].ends_with("<\uff5cAssistant\uff5c><think></think>")) << rendered[0];
  EXPECT_TRUE(rendered[1].ends_with("<\uff5cAssistant\uff5c><think>")) << rendered[1];
  EXPECT_EQ(rendered[2], rendered[1]);

  const ErrorCase cases[] = {
      {R"(, "chat_template_kwargs": {"enable_thinkng": true}})", "chat_template_kwargs"},
      {R"(, "chat_template_kwargs": {"add_generation_prompt": false}})", "chat_template_kwargs.add_generation_prompt"},
      {R"(, "chat_template_kwargs": {"not a name": 1}})", "chat_template_kwargs.not a name"},
      {R"(, "chat_template_kwargs": [true]})", "chat_template_kwargs"},
  };
  for (const ErrorCase& c : cases) {
    const ApiError e = expect_error("{" + messages + c.body, ApiEndpoint::kChatCompletions, ctx);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
  }
  EXPECT_NE(expect_error("{" + messages + cases[0].body, ApiEndpoint::kChatCompletions, ctx).message.find("enable_thinkng"),
            std::string::npos);
  // A reasoning model's thoughts are read where the rendered prompt leaves <think> open; a
  // grammar holds after them.
  ctx.reasoning = ReasoningFormat::kThinkTags;
  ctx.token_vocabulary = structured::TokenVocabulary::from_tokenizer(*tokenizer_);
  const ApiRequest open = expect_ok("{" + messages + R"(, "chat_template_kwargs": {"thinking": true}})",
                                    ApiEndpoint::kChatCompletions, ctx);
  EXPECT_TRUE(open.reasoning && open.starts_in_reasoning && open.include_reasoning);
  const ApiRequest closed = expect_ok("{" + messages + R"(, "include_reasoning": false})", ApiEndpoint::kChatCompletions, ctx);
  EXPECT_TRUE(closed.reasoning && !closed.starts_in_reasoning && !closed.include_reasoning);
  const ApiRequest constrained =
      expect_ok("{" + messages + R"(, "chat_template_kwargs": {"thinking": true}, "response_format": {"type": "json_object"}})",
                ApiEndpoint::kChatCompletions, ctx);
  EXPECT_TRUE(constrained.reasoning && constrained.starts_in_reasoning);
  ASSERT_TRUE(constrained.requests[0]->constraint);
  EXPECT_TRUE(constrained.requests[0]->constraint->matches("It wants JSON.</think>\n\n{}"));
  EXPECT_FALSE(constrained.requests[0]->constraint->matches("{}")) << "the open thoughts must close first";
  // The completions endpoint has no template: the field is unknown there.
  EXPECT_EQ(expect_error(R"({"prompt": "x", "chat_template_kwargs": {}})", ApiEndpoint::kCompletions, ctx_).param,
            "chat_template_kwargs");
}

TEST_F(OpenAiApiTokenizer, ChatResponseAndChunks) {
  ApiRequest r = expect_ok(R"({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true})",
                           ApiEndpoint::kChatCompletions, ctx_);
  ChoiceOutput o;
  o.text = "And God said";
  o.finish_reason = FinishReason::kStop;
  o.completion_tokens = 3;
  SampledToken t;
  t.token = tokenizer_->encode(" God", false).back();
  t.logprob = -1.0f;
  o.tokens = {t};
  json j = json::parse(response_body(r, "chatcmpl-1", 1, {o}, tokenizer_.get()));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "And God said");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["token"], " God");
  json first = json::parse(stream_chunk_body(r, "chatcmpl-1", 1, 0, "", {}, FinishReason::kNone, true, tokenizer_.get()));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  json mid = json::parse(stream_chunk_body(r, "chatcmpl-1", 1, 0, "And", {}, FinishReason::kNone, false, tokenizer_.get()));
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "And");
  json last = json::parse(stream_chunk_body(r, "chatcmpl-1", 1, 0, "", {}, FinishReason::kStop, false, tokenizer_.get()));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace tessera
