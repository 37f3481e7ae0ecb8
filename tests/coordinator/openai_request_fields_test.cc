// The request fields of issue 15 at the API layer: logit_bias, min_tokens,
// include_stop_str_in_output, best_of, suffix, echo + logprobs (prompt logprobs and
// text_offset, streaming and not), and a 400 naming every field Tessera does not implement.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "coordinator/api/api_request_fields.h"
#include "coordinator/api/openai_api.h"

namespace tessera {
namespace {

using nlohmann::json;

ApiContext context() {
  ApiContext c;
  c.model_name = "m";
  c.max_model_len = 64;
  return c;
}

ApiError refused_with_400(const std::string& body, ApiEndpoint ep = ApiEndpoint::kCompletions) {
  ApiRequest req;
  ApiError err;
  EXPECT_FALSE(parse_api_request(ep, body, context(), &req, &err)) << body;
  EXPECT_EQ(err.http_status, 400) << body;
  return err;
}

ApiRequest accepted(const std::string& body, ApiEndpoint ep = ApiEndpoint::kCompletions) {
  ApiRequest req;
  ApiError err;
  EXPECT_TRUE(parse_api_request(ep, body, context(), &req, &err)) << body << " -> " << err.message;
  return req;
}

TEST(RequestFields, LogitBiasIsSortedAndChecked) {
  ApiRequest r = accepted(R"({"prompt": [1], "logit_bias": {"9": -100, "3": 2.5}})");
  const auto& bias = r.requests[0]->sampling.logit_bias;
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias[0], (std::pair<int32_t, float>{3, 2.5f}));
  EXPECT_EQ(bias[1], (std::pair<int32_t, float>{9, -100.0f}));
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "logit_bias": {"9": -101}})").param, "logit_bias.9");
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "logit_bias": {"9": "x"}})").param, "logit_bias.9");
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "logit_bias": {"a": 1}})").param, "logit_bias");
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "logit_bias": {"07": 1}})").param, "logit_bias");
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "logit_bias": {"-1": 1}})").param, "logit_bias");
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "logit_bias": [1]})").param, "logit_bias");
  // Against the vocabulary when one is known.
  std::vector<std::pair<int32_t, float>> out;
  ApiError e;
  EXPECT_FALSE(parse_logit_bias(json::parse(R"({"512": 1})"), 512, &out, &e));
  EXPECT_EQ(e.param, "logit_bias");
  EXPECT_NE(e.message.find("outside the vocabulary of 512"), std::string::npos) << e.message;
  EXPECT_TRUE(parse_logit_bias(json::parse(R"({"511": 1})"), 512, &out, &e));
}

TEST(RequestFields, MinTokensAndStopStringOptions) {
  ApiRequest r = accepted(R"({"prompt": [1], "max_tokens": 8, "min_tokens": 5, "stop_token_ids": [4],
      "include_stop_str_in_output": true, "stop": "x", "priority": -2})");
  const Request& q = *r.requests[0];
  EXPECT_EQ(q.sampling.min_tokens, 5);
  EXPECT_TRUE(q.include_stop_str_in_output);
  EXPECT_EQ(q.priority, -2);
  // The sampler masks the stop token ids until min_tokens (no eos here: no tokenizer).
  EXPECT_EQ(q.choice_sampling(0).min_tokens_stop_ids, (std::vector<int32_t>{4}));
  const ApiError e = refused_with_400(R"({"prompt": [1], "max_tokens": 4, "min_tokens": 5})");
  EXPECT_EQ(e.param, "min_tokens");
  EXPECT_NE(e.message.find("'max_tokens' (4)"), std::string::npos) << e.message;
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "min_tokens": -1})").param, "min_tokens");
}

TEST(RequestFields, SpeculativeOptOutIsABoolean) {
  EXPECT_TRUE(accepted(R"({"prompt": [1]})").requests[0]->speculative);
  EXPECT_FALSE(accepted(R"({"prompt": [1], "speculative": false})").requests[0]->speculative);
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "speculative": "no"})").param, "speculative");
}

TEST(RequestFields, BestOfGeneratesMoreThanItReturns) {
  ApiRequest r = accepted(R"({"prompt": [1, 2], "n": 2, "best_of": 3})");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 3);
  EXPECT_EQ(r.requests[0]->n, 3);  // the engine generates best_of choices
  EXPECT_EQ(r.num_choices(), 3u);
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "n": 3, "best_of": 2})").param, "best_of");
  EXPECT_EQ(refused_with_400(R"({"prompt": [1], "best_of": 2, "stream": true})").param, "best_of");
  accepted(R"({"prompt": [1], "best_of": 1, "stream": true})");
  EXPECT_EQ(refused_with_400(R"({"messages": [{"role": "user", "content": "x"}], "best_of": 2})",
                         ApiEndpoint::kChatCompletions)
                .param,
            "best_of");

  // The n of each prompt's best_of with the highest cumulative logprob, best first.
  std::vector<ChoiceOutput> outs(3);
  const float sums[3] = {-3.0f, -1.0f, -2.0f};
  for (int c = 0; c < 3; ++c) {
    outs[c].text = std::string(1, static_cast<char>('a' + c));
    SampledToken t;
    t.token = 5;
    t.logprob = sums[c] / 2;
    outs[c].tokens = {t, t};
    outs[c].completion_tokens = 2;
    outs[c].finish_reason = FinishReason::kLength;
  }
  json j = json::parse(response_body(r, "cmpl-1", 1, outs, nullptr));
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], "b");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][1]["text"], "c");
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);  // the choices returned
}

TEST(RequestFields, SuffixNeedsAFillInTheMiddleTemplate) {
  const ApiError e = refused_with_400(R"({"prompt": [1], "suffix": "tail"})");
  EXPECT_EQ(e.param, "suffix");
  EXPECT_NE(e.message.find("fill-in-the-middle"), std::string::npos) << e.message;
  accepted(R"({"prompt": [1], "suffix": ""})");
  accepted(R"({"prompt": [1], "suffix": null})");
}

TEST(RequestFields, UnimplementedFieldsAreRefusedByName) {
  const char* const kChat = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    std::string field;
    std::string value;
    bool chat;
  };
  const std::vector<Case> cases = {
      {"response_format", R"({"type": "bogus"})", false},
      {"response_format", R"({"type": "json_object"})", true},
      {"response_format", R"({"type": "json_schema", "json_schema": {}})", true},
      // tools and tool_choice are served (chat_request_test.cc); forcing a call without tools is not.
      {"tool_choice", R"("required")", true},
      {"tool_choice", R"({"type": "function", "function": {"name": "f"}})", true},
      {"tools", R"([{"type": "function", "function": {"name": "f"}}])", false},  // a chat field
      {"functions", R"([{"name": "f"}])", true},
      {"function_call", R"("auto")", true},
      {"guided_json", R"({"type": "object"})", false},
      {"guided_choice", R"(["a", "b"])", true},
      {"guided_regex", R"("a+")", false},
      {"guided_grammar", R"("root ::= \"a\"")", false},
      {"guided_decoding_backend", R"("outlines")", false},
      {"prompt_logprobs", "1", false},
      {"use_beam_search", "true", false},
      {"allowed_token_ids", "[1]", false},
      {"bad_words", R"(["x"])", false},
      {"truncate_prompt_tokens", "4", false},
      {"spaces_between_special_tokens", "false", false},
      {"top_logprobs", "2", false},  // a chat field
      {"echo", "true", true},        // a completions field
      {"no_such_field", "1", false},
  };
  for (const Case& c : cases) {
    const std::string body = std::string("{") + (c.chat ? kChat : R"("prompt": [1])") + ", \"" + c.field +
                             "\": " + c.value + "}";
    const ApiError e =
        refused_with_400(body, c.chat ? ApiEndpoint::kChatCompletions : ApiEndpoint::kCompletions);
    EXPECT_EQ(e.param, c.field) << body;
    EXPECT_NE(e.message.find(c.field), std::string::npos) << e.message;
  }
  // What asks for nothing missing is fine: no tools, tool_choice none, plain text, nulls.
  // (This context has no tokenizer, so chat bodies stop at the field check.)
  ApiError e;
  EXPECT_TRUE(check_request_fields(ApiEndpoint::kChatCompletions, json::parse(std::string("{") + kChat + R"(,
      "tools": [], "tool_choice": "none", "parallel_tool_calls": false, "response_format": {"type": "text"},
      "guided_json": null, "store": false})"), &e))
      << e.message;
  accepted(R"({"prompt": [1], "response_format": {"type": "text"}, "use_beam_search": false})");
}

TEST(RequestFields, EchoWithLogprobsAsksPromptLogprobsAndReturnsThem) {
  ApiRequest plain = accepted(R"({"prompt": [4, 5, 6], "logprobs": 1})");
  EXPECT_EQ(plain.requests[0]->sampling.prompt_logprobs, -1);  // normal prefill, no prompt rows
  ApiRequest r = accepted(R"({"prompt": [4, 5, 6], "echo": true, "logprobs": 1})");
  EXPECT_EQ(r.requests[0]->sampling.prompt_logprobs, 1);
  EXPECT_EQ(r.requests[0]->choice_sampling(1).prompt_logprobs, -1);  // choice 0 asks for all choices

  ChoiceOutput out;
  out.text = "g";
  out.finish_reason = FinishReason::kLength;
  out.completion_tokens = 2;
  SampledToken t;
  t.token = 9;
  t.logprob = -0.5f;
  t.top_logprobs = {{9, -0.5f}};
  out.tokens = {t, t};
  for (int p = 1; p < 3; ++p) {
    PromptLogprob lp;
    lp.position = p;
    lp.token = 4 + p;
    lp.logprob = -1.0f * p;
    lp.top_logprobs = {{3, -0.1f}};
    out.prompt_logprobs.push_back(lp);
  }
  json j = json::parse(response_body(r, "cmpl-1", 1, {out}, nullptr));
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  EXPECT_EQ(lp["tokens"][0], "token_id:4");
  EXPECT_EQ(lp["tokens"][3], "token_id:9");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -1.0f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][2].get<float>(), -2.0f);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][2]["token_id:3"].get<float>(), -0.1f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][3].get<float>(), -0.5f);
  // Offsets: the prompt tokens from 0 ("token_id:4" is 10 bytes); the generated ones after
  // the echoed prompt text (empty here: no tokenizer decodes it).
  EXPECT_EQ(lp["text_offset"], json::parse("[0, 10, 20, 0, 10]"));

  // Streaming: the echo chunk carries the prompt part; chunk offsets run on.
  size_t offset = 0;
  json echo = json::parse(stream_echo_body(r, "cmpl-1", 1, 0, out.prompt_logprobs, nullptr, &offset));
  EXPECT_EQ(echo["choices"][0]["logprobs"]["text_offset"], json::parse("[0, 10, 20]"));
  EXPECT_EQ(offset, 0u);
  std::vector<json> offsets;
  for (int k = 0; k < 2; ++k) {
    json c = json::parse(stream_chunk_body(r, "cmpl-1", 1, 0, "g", {t}, FinishReason::kNone, false, nullptr, &offset));
    offsets.push_back(c["choices"][0]["logprobs"]["text_offset"][0]);
  }
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[1], 10);  // not 0 again: continues after the first chunk's token
}

}  // namespace
}  // namespace tessera
