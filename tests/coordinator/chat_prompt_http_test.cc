// What a chat request's prompt holds, through the real HTTP front end (chat_http_fixture.h):
// add_generation_prompt false renders the conversation as it stands, and
// continue_final_message ends the prompt inside the final message so the model writes on
// from its last word (vLLM's and transformers' fields), with the fixtures' real templates;
// reasoning_effort reaches a template that reads it and is refused by one that does not.
#include "tests/coordinator/chat_http_fixture.h"

namespace tessera {
namespace {

using namespace chat_http;  // NOLINT: the fixture's helpers and json aliases

class ChatPromptHttpTest : public ChatHttpTest {
 protected:
  json chat(const std::string& last_role, const std::string& last_text, const std::string& extra) const {
    json b = body(extra);
    b["messages"].push_back({{"role", last_role}, {"content", last_text}});
    return b;
  }
};

TEST_F(ChatPromptHttpTest, ContinueFinalMessageEndsThePromptInsideIt) {
  start("qwen2.5-7b-instruct");
  const std::string cont = R"("continue_final_message": true)";
  // Qwen's template keeps content verbatim: the prompt ends with the message's last byte.
  EXPECT_TRUE(rendered_prompt(chat("assistant", "The answer is", cont)).ends_with("<|im_start|>assistant\nThe answer is"))
      << rendered_prompt(chat("assistant", "The answer is", cont));
  EXPECT_TRUE(rendered_prompt(chat("assistant", "The answer is ", cont)).ends_with("assistant\nThe answer is "));
  // Without it, the turn is closed and a new one opened; add_generation_prompt false closes it only.
  EXPECT_TRUE(rendered_prompt(chat("assistant", "The answer is", "")).ends_with("The answer is<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_TRUE(rendered_prompt(chat("assistant", "The answer is", R"("add_generation_prompt": false)")).ends_with("The answer is<|im_end|>\n"));
  // The reply is the continuation alone.
  script("forty two");
  const json r = post(chat("assistant", "The answer is", cont));
  EXPECT_EQ(r["choices"][0]["message"]["content"], written_) << r;
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
}

// Gemma's template trims each message: the prompt ends at the trimmed text.
TEST_F(ChatPromptHttpTest, ATemplateThatTrimsIsCutAtTheTrimmedText) {
  start("gemma-2-2b-it");
  const std::string p = rendered_prompt(chat("assistant", "  The answer is  ", R"("continue_final_message": true)"));
  EXPECT_TRUE(p.ends_with("<start_of_turn>model\nThe answer is")) << p;
}

TEST_F(ChatPromptHttpTest, WrongValuesAre400sNamingTheField) {
  start("qwen2.5-7b-instruct");
  const std::vector<std::pair<std::string, json>> cases = {
      {"continue_final_message", chat("assistant", "x", R"("continue_final_message": true, "add_generation_prompt": true)")},
      {"continue_final_message", chat("assistant", " \n", R"("continue_final_message": true)")},
      {"continue_final_message", chat("assistant", "\f\v", R"("continue_final_message": true)")},
      {"continue_final_message", chat("assistant", "x", R"("continue_final_message": "yes")")},
      {"add_generation_prompt", chat("user", "x", R"("add_generation_prompt": 1)")},
  };
  for (const auto& [param, b] : cases) {
    for (const char* path : {"/v1/chat/completions", "/tokenize"}) {
      json sent = b;
      if (std::string(path) == "/tokenize") sent.erase("max_tokens");
      auto r = client_->post_json(path, sent.dump());
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->status, 400) << path << " " << sent << " -> " << r->body;
      EXPECT_EQ(json::parse(r->body)["error"]["param"], param) << path << " " << r->body;
    }
  }
}

// A template that rewrites the final message leaves nowhere to continue from.
TEST_F(ChatPromptHttpTest, ATemplateThatRewritesTheMessageIsA400) {
  start_with_template("{% for m in messages %}{{ m.content | upper }}{% endfor %}", std::nullopt, std::nullopt, std::nullopt);
  const json r = post(chat("assistant", "the answer is", R"("continue_final_message": true)"), 400);
  EXPECT_EQ(r["error"]["param"], "continue_final_message") << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("does not hold the final message"), std::string::npos) << r;
}

// reasoning_effort (chat) and reasoning.effort (Responses) are the template's variable: the
// prompt is the template's rendering with it (its token count tells), and a template that
// never reads it refuses it rather than dropping it.
TEST_F(ChatPromptHttpTest, ReasoningEffortReachesATemplateThatReadsIt) {
  start_with_template("Effort {{ reasoning_effort if reasoning_effort is defined else 'medium' }}."
                      "{% for m in messages %} {{ m.content }}{% endfor %}",
                      std::nullopt, std::nullopt, std::nullopt);
  script("Amen");
  for (const char* effort : {"low", "absolutely everything you have"}) {
    const size_t expected = tokenizer_->encode(std::string("Effort ") + effort + ". Weather in Paris?", false).size();
    const json r = post(body(std::string(R"("reasoning_effort": ")") + effort + "\""));
    EXPECT_EQ(r["usage"]["prompt_tokens"], expected) << effort << " " << r;
    auto resp = client_->post_json("/v1/responses", json({{"input", "Weather in Paris?"}, {"reasoning", {{"effort", effort}}}}).dump());
    ASSERT_TRUE(resp.is_ok() && resp->status == 200) << (resp.is_ok() ? resp->body : resp.status().to_string());
    EXPECT_EQ(json::parse(resp->body)["usage"]["input_tokens"], expected) << resp->body;
    EXPECT_EQ(json::parse(resp->body)["reasoning"]["effort"], effort) << resp->body;
  }
  const json twice = post(body(R"("reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"})"), 400);
  EXPECT_EQ(twice["error"]["param"], "reasoning_effort") << twice;
  EXPECT_EQ(post(body(R"("reasoning_effort": 3)"), 400)["error"]["param"], "reasoning_effort");
  auto summary = client_->post_json("/v1/responses", R"({"input": "x", "reasoning": {"effort": "low", "summary": "auto"}})");
  ASSERT_TRUE(summary.is_ok());
  EXPECT_EQ(summary->status, 400) << summary->body;
  EXPECT_EQ(json::parse(summary->body)["error"]["param"], "reasoning.summary") << summary->body;
}

TEST_F(ChatPromptHttpTest, ReasoningEffortIsRefusedByATemplateThatNeverReadsIt) {
  start("qwen2.5-7b-instruct");
  const json r = post(body(R"("reasoning_effort": "high")"), 400);
  EXPECT_EQ(r["error"]["param"], "reasoning_effort") << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("never reads 'reasoning_effort'"), std::string::npos) << r;
}

}  // namespace
}  // namespace tessera
