// Tool calls end to end through the real HTTP front end: a real HttpServer and EngineService
// with the kjv-llama tokenizer and real chat templates of tool-use models (the fixtures'
// Qwen 2.5, Llama 3.1 and Mistral-Nemo), and a scripted model — the executor "generates" the
// tokens of a scripted text, then EOS — so the Hermes, Llama 3.1 JSON and Mistral call texts
// come back as OpenAI tool_calls, streaming and not. Also: tool_choice "none", malformed call
// text, a template's raise_exception as a 400, and the prompt the template renders. Forced
// calls (tool_choice "required" / named): the model draws uniformly from the grammar's mask,
// and every sample reads back as valid calls in each format; the refusals are 400s.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>
#include <random>

#include "coordinator/server/http_server.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "tools/client/http_client.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// One of the ids a token mask allows (a bitset, as SeqStep::allowed_tokens), chosen by `key`.
int32_t uniform_allowed(const std::vector<uint32_t>& mask, uint64_t key) {
  std::vector<int32_t> allowed;
  for (size_t w = 0; w < mask.size(); ++w)
    for (int b = 0; b < 32; ++b)
      if (mask[w] >> b & 1u) allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(b)));
  std::mt19937_64 rng(key);
  return allowed.empty() ? 2 : allowed[rng() % allowed.size()];
}

// What the model (tests/scripted_executor.h) writes: every sequence `tokens`, then EOS (id 2).
// Under a grammar (a forced tool call) it draws from the allowed tokens uniformly, by (seed,
// position): a seeded temperature-1 request is a random sample, the same one each time, and
// greedy (temperature 0) is one fixed draw per position.
testing::TokenScript model_writing(std::vector<int32_t> tokens) {
  return [text = testing::script_then(std::move(tokens), 2)](const testing::SampleRow& r) {
    const std::vector<uint32_t>& mask = r.view->step->allowed_tokens;
    if (mask.empty()) return text(r);
    const SamplingParams& sp = r.view->state->sampling;
    const uint64_t key = (sp.temperature == 0 ? 99 : sp.seed.value_or(1)) * 1000003u + static_cast<uint64_t>(r.index);
    return uniform_allowed(mask, key);
  };
}

const char* const kWeatherTools = R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Get the weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";

class ToolCallsHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto t = Tokenizer::load(testing::fixtures_dir() + "/kjv-llama");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tokenizer_ = std::move(t).value();
  }
  // The kjv tokenizer with `content` added as special token id 1024 (real Mistral tokenizers
  // hold [TOOL_CALLS] so), written to a temporary model folder; start() serves with it.
  int32_t use_tokenizer_with_special_token(const std::string& content) {
    const std::string src = testing::fixtures_dir() + "/kjv-llama";
    ojson tj = ojson::parse(testing::read_file(src + "/tokenizer.json"));
    const int32_t id = static_cast<int32_t>(tj["model"]["vocab"].size());
    tj["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                  {"rstrip", false}, {"normalized", false}, {"special", true}});
    const std::string dir = temp_dir_ = testing::make_temp_dir("tool-tokenizer");
    testing::write_file(dir + "/tokenizer.json", tj.dump());
    testing::write_file(dir + "/tokenizer_config.json", testing::read_file(src + "/tokenizer_config.json"));
    auto t = Tokenizer::load(dir);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    if (t.is_ok()) tokenizer_ = std::move(t).value();
    return id;
  }

  void TearDown() override {
    if (server_) server_->stop();
    if (service_) service_->stop();
    if (!temp_dir_.empty()) std::filesystem::remove_all(temp_dir_);
  }

  // Serves with the fixture template `id`; the tool-call and reasoning formats are what
  // `auto` decides from it unless `reasoning` says.
  void start(const std::string& id, std::optional<ReasoningFormat> reasoning = std::nullopt) {
    const std::string path = testing::fixtures_dir() + "/chat_templates/templates/" + id + ".json";
    const json spec = json::parse(testing::read_file(path));
    auto tmpl = ChatTemplate::parse(spec["template"].get<std::string>());
    ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
    tmpl->set_special_tokens(spec["bos_token"].is_string() ? std::optional<std::string>(spec["bos_token"]) : std::nullopt,
                             spec["eos_token"].is_string() ? std::optional<std::string>(spec["eos_token"]) : std::nullopt);
    template_ = std::make_shared<const ChatTemplate>(std::move(tmpl).value());
    EngineServiceOptions eo;
    eo.scheduler.block_size = 16;
    eo.scheduler.num_blocks = 1024;
    eo.scheduler.max_model_len = 8192;
    eo.scheduler.max_num_batched_tokens = 8192;
    service_ = std::make_unique<EngineService>(eo, model_, tokenizer_.get());
    service_->start();
    HttpServerOptions o;
    o.port = 0;
    o.model_name = "kjv";
    auto shared = template_;
    o.chat_renderer = [shared](const ojson& c) { return shared->render(c); };
    o.tool_call_format = tool_call_format_for_template(template_->source());
    o.reasoning_format = reasoning ? *reasoning : reasoning_format_for_template(template_->source());
    server_ = std::make_unique<HttpServer>(o, *service_, tokenizer_.get());
    ASSERT_TRUE(server_->start().is_ok());
    auto client = HttpClient::create("http://127.0.0.1:" + std::to_string(server_->port()));
    ASSERT_TRUE(client.is_ok());
    client_ = std::move(client).value();
  }

  // The model will write `text`. Its tokens come from the kjv tokenizer, whose encoding
  // starts with a word-start piece: after the prompt the model's text reads " " + text.
  // written_ is what it wrote, as a request without tools returns it.
  void script(const std::string& text) {
    const std::vector<int32_t> ids = tokenizer_->encode(text, false);
    ASSERT_EQ(tokenizer_->decode(ids, true), text) << "the kjv tokenizer does not round-trip: " << text;
    model_.set_tokens(model_writing(ids));
    written_ = post(body())["choices"][0]["message"]["content"].get<std::string>();
    ASSERT_TRUE(written_ == text || written_ == " " + text) << written_;
  }

  json body(const std::string& extra = "") const {
    json b = json::parse(std::string(R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 300)") +
                         (extra.empty() ? "" : ", " + extra) + "}");
    return b;
  }

  json post(const json& b, int expect_status = 200) {
    auto r = client_->post_json("/v1/chat/completions", b.dump());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) return json();
    EXPECT_EQ(r->status, expect_status) << r->body;
    return json::parse(r->body, nullptr, false);
  }

  // A stream folded as a client folds it: content joined, tool calls assembled by index.
  struct Folded {
    json reasoning = nullptr;  // reasoning_content deltas joined; null when there were none
    json content = nullptr;
    json tool_calls = json::array();
    std::string finish_reason;
  };
  Folded stream(json b) {
    b["stream"] = true;
    Folded f;
    std::string content, reasoning;
    bool any_content = false, any_reasoning = false;
    auto r = client_->post_stream("/v1/chat/completions", b.dump(), [&](std::string_view payload) {
      const json ev = json::parse(payload);
      const json& choice = ev["choices"][0];
      const json& delta = choice["delta"];
      if (delta.contains("reasoning_content")) {
        reasoning += delta["reasoning_content"].get<std::string>();
        any_reasoning = true;
      }
      if (delta.contains("content") && !delta["content"].get<std::string>().empty()) {
        content += delta["content"].get<std::string>();
        any_content = true;
      }
      if (delta.contains("tool_calls")) {
        for (const json& tc : delta["tool_calls"]) {
          const size_t i = tc["index"].get<size_t>();
          if (i == f.tool_calls.size()) {
            // A call's first delta carries everything but the arguments.
            EXPECT_TRUE(tc.contains("id") && tc["type"] == "function" && tc["function"].contains("name")) << tc;
            f.tool_calls.push_back({{"id", tc["id"]}, {"type", "function"},
                                    {"function", {{"name", tc["function"]["name"]}, {"arguments", ""}}}});
          }
          EXPECT_LT(i, f.tool_calls.size()) << tc;
          if (i < f.tool_calls.size() && tc["function"].contains("arguments"))
            f.tool_calls[i]["function"]["arguments"] =
                f.tool_calls[i]["function"]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
        }
      }
      if (!choice["finish_reason"].is_null()) f.finish_reason = choice["finish_reason"];
      return true;
    });
    EXPECT_TRUE(r.is_ok() && r->done) << (r.is_ok() ? r->response.body : r.status().to_string());
    if (any_content) f.content = content;
    if (any_reasoning) f.reasoning = reasoning;
    return f;
  }

  // The non-streaming and streaming answers both hold `calls` (name, arguments) and `content`.
  void expect_calls(const json& calls, const json& content) {
    const json b = body(std::string("\"tools\": ") + kWeatherTools);
    const json r = post(b);
    const json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r;
    EXPECT_EQ(choice["message"]["content"], content) << r;
    ASSERT_EQ(choice["message"]["tool_calls"].size(), calls.size()) << r;
    for (size_t i = 0; i < calls.size(); ++i) {
      const json& tc = choice["message"]["tool_calls"][i];
      EXPECT_EQ(tc["type"], "function");
      EXPECT_TRUE(tc["id"].is_string() && !tc["id"].get<std::string>().empty());
      EXPECT_EQ(tc["function"]["name"], calls[i][0]) << tc;
      EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), calls[i][1]) << tc;
    }
    const Folded s = stream(b);
    EXPECT_EQ(s.finish_reason, "tool_calls");
    EXPECT_EQ(s.content, content);
    ASSERT_EQ(s.tool_calls.size(), calls.size()) << s.tool_calls;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(s.tool_calls[i]["function"]["name"], calls[i][0]);
      EXPECT_EQ(s.tool_calls[i]["function"]["arguments"], choice["message"]["tool_calls"][i]["function"]["arguments"]);
    }
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  testing::ScriptedExecutor model_{model_writing({})};
  std::shared_ptr<const ChatTemplate> template_;
  std::string written_;
  std::string temp_dir_;
  std::unique_ptr<EngineService> service_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<HttpClient> client_;
};

TEST_F(ToolCallsHttpTest, HermesCallsFromQwenStyleOutput) {
  start("qwen2.5-7b-instruct");
  script("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>");
  expect_calls(json::array({json::array({"get_weather", {{"city", "Paris"}}}),
                            json::array({"get_weather", {{"city", "Lyon"}}})}),
               nullptr);
  // Text before a call is the content.
  script("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
  expect_calls(json::array({json::array({"get_weather", {{"city", "Rome"}}})}),
               written_.substr(0, written_.find("<tool_call>")));
  EXPECT_NE(written_.substr(0, written_.find("<tool_call>")).find("Let me check.\n"), std::string::npos) << written_;
}

TEST_F(ToolCallsHttpTest, Llama31JsonCalls) {
  start("llama3.1-8b-instruct");
  script("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  expect_calls(json::array({json::array({"get_weather", {{"city", "Paris"}}})}), nullptr);
}

TEST_F(ToolCallsHttpTest, MistralCalls) {
  start("mistral-nemo-instruct-2407");
  script("[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
         "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Nice\"}}]");
  expect_calls(json::array({json::array({"get_weather", {{"city", "Paris"}}}),
                            json::array({"get_weather", {{"city", "Nice"}}})}),
               nullptr);
  // Mistral's templates need 9-alphanumeric call ids when the calls are sent back.
  const json r = post(body(std::string("\"tools\": ") + kWeatherTools));
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["id"].get<std::string>().size(), 9u) << r;
}

// With a real Mistral tokenizer [TOOL_CALLS] is a special token. A request that reads calls
// keeps special tokens in the text by default, so the parser sees the marker; the EOS that
// ends the output is not text (vLLM), unless include_stop_str_in_output asks for it.
TEST_F(ToolCallsHttpTest, MistralMarkerThatIsASpecialToken) {
  const int32_t marker = use_tokenizer_with_special_token("[TOOL_CALLS]");
  start("mistral-nemo-instruct-2407");
  const std::string calls = " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]";
  std::vector<int32_t> ids = {marker};
  for (int32_t t : tokenizer_->encode(calls, false)) ids.push_back(t);
  model_.set_tokens(model_writing(ids));
  expect_calls(json::array({json::array({"get_weather", {{"city", "Paris"}}})}), nullptr);

  const std::string tools = std::string("\"tools\": ") + kWeatherTools;
  // Without tools the default skips special tokens: the text is the array alone.
  const std::string plain = post(body())["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_EQ(plain.find("[TOOL_CALLS]"), std::string::npos) << plain;
  EXPECT_NE(plain.find("get_weather"), std::string::npos) << plain;
  // The client's own skip_special_tokens: true hides the marker, so there are no calls.
  json r = post(body(tools + ", \"skip_special_tokens\": true"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
  EXPECT_EQ(r["choices"][0]["message"]["content"], plain) << r;
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls")) << r;
  // Special tokens kept without tools: the marker is text, the EOS is not...
  r = post(body("\"skip_special_tokens\": false"));
  const std::string kept = r["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_NE(kept.find("[TOOL_CALLS]"), std::string::npos) << r;
  EXPECT_EQ(kept.find("</s>"), std::string::npos) << r;
  // ... unless include_stop_str_in_output keeps the stop token too, streaming and not.
  const json with_eos = body("\"skip_special_tokens\": false, \"include_stop_str_in_output\": true");
  r = post(with_eos);
  EXPECT_EQ(r["choices"][0]["message"]["content"], kept + "</s>") << r;
  EXPECT_EQ(stream(with_eos).content, kept + "</s>");
  EXPECT_EQ(stream(body("\"skip_special_tokens\": false")).content, kept);
}

TEST_F(ToolCallsHttpTest, NoneMalformedAndNoToolsLeaveTheTextAsContent) {
  start("qwen2.5-7b-instruct");
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  script(call);
  for (const std::string& extra : {std::string("\"tools\": ") + kWeatherTools + ", \"tool_choice\": \"none\"", std::string()}) {
    const json r = post(body(extra));
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
    EXPECT_EQ(r["choices"][0]["message"]["content"], written_) << r;
    EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls")) << r;
    const Folded s = stream(body(extra));
    EXPECT_EQ(s.content, written_);
    EXPECT_EQ(s.finish_reason, "stop");
    EXPECT_TRUE(s.tool_calls.empty());
  }
  const std::string broken = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>";
  script(broken);
  const json b = body(std::string("\"tools\": ") + kWeatherTools);
  const json r = post(b);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
  EXPECT_EQ(r["choices"][0]["message"]["content"], written_) << r;
  const Folded s = stream(b);
  EXPECT_EQ(s.content, written_);
  EXPECT_TRUE(s.tool_calls.empty());
}

TEST_F(ToolCallsHttpTest, PromptIsTheTemplatesRenderingWithToolsAndToolMessages) {
  start("qwen2.5-7b-instruct");
  script("ok");
  // The fixture's tools conversation as an OpenAI client sends it (arguments as JSON text),
  // read in the file's key order (the template prints the tool schema with tojson).
  const ojson conv = ojson::parse(testing::read_file(testing::fixtures_dir() + "/chat_templates/conversations.json"));
  ojson f;
  for (const ojson& c : conv)
    if (c["id"] == "f_tools") f = c;
  ASSERT_FALSE(f.is_null());
  ojson messages = f["messages"];
  for (ojson& m : messages)
    if (m.contains("tool_calls"))
      for (ojson& tc : m["tool_calls"]) tc["function"]["arguments"] = tc["function"]["arguments"].dump();
  ojson req = ojson::object();
  req["messages"] = messages;
  req["tools"] = f["tools"];
  req["max_tokens"] = 5;
  auto r = client_->post_json("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r.is_ok());
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string expected =
      testing::read_file(testing::fixtures_dir() + "/chat_templates/expected/qwen2.5-7b-instruct__f_tools.txt");
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], tokenizer_->encode(expected, false).size());
  // /tokenize renders the same request to exactly those tokens.
  ojson tok = req;
  tok.erase("max_tokens");
  auto t = client_->post_json("/tokenize", tok.dump());
  ASSERT_TRUE(t.is_ok());
  ASSERT_EQ(t->status, 200) << t->body;
  EXPECT_EQ(json::parse(t->body)["tokens"].get<std::vector<int32_t>>(), tokenizer_->encode(expected, false));
}

// chat_template_kwargs over HTTP: DeepSeek-V3.1's template leaves its think block open with
// {"thinking": true} (the prompt ends "<think>" instead of "<think></think>"), and /tokenize
// renders the same; a name the template never reads is a 400 naming the field.
TEST_F(ToolCallsHttpTest, ChatTemplateKwargsReachTheTemplate) {
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
TEST_F(ToolCallsHttpTest, ThoughtsGoToReasoningContentAndTheAnswerToContent) {
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
TEST_F(ToolCallsHttpTest, ToolCallsAfterTheThoughtsAreReadFromTheAnswer) {
  start("qwen2.5-7b-instruct", ReasoningFormat::kThinkTags);
  const std::string text =
      "<think>The user wants the weather.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>";
  model_.set_tokens(model_writing(tokenizer_->encode(text, false)));
  const json b = body(std::string("\"tools\": ") + kWeatherTools);
  const json choice = post(b)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << choice;
  EXPECT_NE(choice["message"]["reasoning_content"].get<std::string>().find("The user wants the weather."),
            std::string::npos) << choice;
  EXPECT_TRUE(choice["message"]["content"].is_null()) << choice;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice;
  EXPECT_EQ(json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  const Folded s = stream(b);
  EXPECT_EQ(s.finish_reason, "tool_calls");
  EXPECT_EQ(s.reasoning, choice["message"]["reasoning_content"]);
  EXPECT_EQ(s.content, nullptr);
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.tool_calls[0]["function"]["arguments"], choice["message"]["tool_calls"][0]["function"]["arguments"]);
}

// DeepSeek-R1's real template (this version ends the prompt at the assistant tag, and the
// model opens its thoughts itself, as R1 does): chat splits them (whole and streamed); the
// Responses API gives a reasoning item before the message, and streams reasoning_text deltas
// before the answer's output_text ones.
TEST_F(ToolCallsHttpTest, DeepSeekR1ThoughtsComeApartInChatAndResponses) {
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

TEST_F(ToolCallsHttpTest, TemplateRaiseIsA400WithItsMessage) {
  start("gemma-7b-it");
  const json r = post(json::parse(R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})"),
                      400);
  EXPECT_EQ(r["error"]["type"], "invalid_request_error") << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("System role not supported"), std::string::npos) << r;
}

// --- Forced calls: tool_choice "required" or a named function ---

const char* const kForcedTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"]}}}])";

// The arguments hold the schema's required keys with their types (and nothing unlisted).
void expect_forced_arguments(const json& call) {
  const std::string name = call["function"]["name"];
  const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(args.is_object()) << call;
  if (name == "get_weather") {
    EXPECT_TRUE(args.contains("city") && args["city"].is_string()) << call;
    if (args.contains("unit")) { EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << call; }
    for (auto it = args.begin(); it != args.end(); ++it) EXPECT_TRUE(it.key() == "city" || it.key() == "unit") << call;
  } else {
    ASSERT_EQ(name, "add") << call;
    EXPECT_TRUE(args.contains("a") && args["a"].is_number_integer() && args["a"] >= -999 && args["a"] <= 999) << call;
    EXPECT_TRUE(args.contains("b") && args["b"].is_number_integer() && args["b"] >= 0 && args["b"] <= 99) << call;
  }
}

class ForcedToolCallsHttpTest : public ToolCallsHttpTest {
 protected:
  json forced_body(const std::string& choice, int seed, const std::string& extra = "") const {
    return body(std::string("\"tools\": ") + kForcedTools + ", \"tool_choice\": " + choice +
                ", \"temperature\": " + (seed < 0 ? "0" : "1, \"seed\": " + std::to_string(seed)) +
                ", \"max_tokens\": 800" + (extra.empty() ? "" : ", " + extra));
  }

  // 12 seeded temperature-1 samples of "required", of a named function and of "required"
  // with parallel_tool_calls false: every one is calls only (content null, finish_reason
  // "tool_calls"), each a function of the tools with valid arguments; the samples call both
  // functions and make parallel calls; greedy streams the calls it answers whole.
  void expect_forced_calls_in_every_sample() {
    std::set<std::string> names;
    size_t most = 0;
    for (int seed = 1; seed <= 12; ++seed) {
      const json r = post(forced_body("\"required\"", seed));
      const json& choice = r["choices"][0];
      ASSERT_EQ(choice["finish_reason"], "tool_calls") << r;
      EXPECT_TRUE(choice["message"]["content"].is_null()) << r;
      ASSERT_GE(choice["message"]["tool_calls"].size(), 1u) << r;
      most = std::max(most, choice["message"]["tool_calls"].size());
      for (const json& call : choice["message"]["tool_calls"]) {
        names.insert(call["function"]["name"].get<std::string>());
        expect_forced_arguments(call);
      }
      // Named: that function, once.
      const json n = post(forced_body(R"({"type": "function", "function": {"name": "add"}})", seed));
      ASSERT_EQ(n["choices"][0]["finish_reason"], "tool_calls") << n;
      ASSERT_EQ(n["choices"][0]["message"]["tool_calls"].size(), 1u) << n;
      EXPECT_EQ(n["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "add") << n;
      expect_forced_arguments(n["choices"][0]["message"]["tool_calls"][0]);
      // parallel_tool_calls false: one call.
      const json one = post(forced_body("\"required\"", seed, "\"parallel_tool_calls\": false"));
      ASSERT_EQ(one["choices"][0]["finish_reason"], "tool_calls") << one;
      ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u) << one;
      expect_forced_arguments(one["choices"][0]["message"]["tool_calls"][0]);
    }
    EXPECT_EQ(names.size(), 2u) << "both functions get called in 12 samples";
    EXPECT_GE(most, 2u) << "parallel calls are written";
    // Greedy: the stream folds into the same calls.
    const json b = forced_body("\"required\"", -1);
    const json whole = post(b)["choices"][0];
    const Folded s = stream(b);
    EXPECT_EQ(s.finish_reason, "tool_calls");
    EXPECT_TRUE(s.content.is_null()) << s.content;
    ASSERT_EQ(s.tool_calls.size(), whole["message"]["tool_calls"].size()) << whole;
    for (size_t i = 0; i < s.tool_calls.size(); ++i) {
      EXPECT_EQ(s.tool_calls[i]["function"], whole["message"]["tool_calls"][i]["function"]);
    }
  }

  void expect_400(const json& b, const std::string& param, const std::string& says) {
    const json r = post(b, 400);
    EXPECT_EQ(r["error"]["param"], param) << r;
    EXPECT_NE(r["error"]["message"].get<std::string>().find(says), std::string::npos) << r;
  }
};

TEST_F(ForcedToolCallsHttpTest, HermesSamplesAreValidCalls) {
  start("qwen2.5-7b-instruct");
  expect_forced_calls_in_every_sample();
}

TEST_F(ForcedToolCallsHttpTest, Llama31JsonSamplesAreValidCalls) {
  start("llama3.1-8b-instruct");
  expect_forced_calls_in_every_sample();
}

TEST_F(ForcedToolCallsHttpTest, MistralSamplesAreValidCalls) {
  start("mistral-nemo-instruct-2407");
  expect_forced_calls_in_every_sample();
}

// [TOOL_CALLS] as a special token (id 1024): the grammar's first mask allows it (the vocabulary
// the matcher walks gives it its text), its text stays in the output for the parser, and the
// samples that start with it are read as calls like those that spell it with ordinary tokens.
TEST_F(ForcedToolCallsHttpTest, MistralSpecialTokenMarker) {
  const int32_t marker = use_tokenizer_with_special_token("[TOOL_CALLS]");
  start("mistral-nemo-instruct-2407");
  int special_first = 0;
  for (int seed = 1; seed <= 12; ++seed) {
    const json r = post(forced_body("\"required\"", seed, "\"logprobs\": true"));
    const json& choice = r["choices"][0];
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << r;
    ASSERT_GE(choice["message"]["tool_calls"].size(), 1u) << r;
    for (const json& call : choice["message"]["tool_calls"]) expect_forced_arguments(call);
    if (choice["logprobs"]["content"][0]["token"] == "[TOOL_CALLS]") ++special_first;
  }
  EXPECT_GT(special_first, 0) << "token " << marker << " was never drawn first";
  // skip_special_tokens true would hide the marker: refused, naming it.
  expect_400(forced_body("\"required\"", 1, "\"skip_special_tokens\": true"), "skip_special_tokens", "[TOOL_CALLS]");
}

TEST_F(ForcedToolCallsHttpTest, RefusalsAre400sNamingTheProblem) {
  start("qwen2.5-7b-instruct");
  expect_400(forced_body(R"({"type": "function", "function": {"name": "get_time"}})", 1), "tool_choice", "'get_time'");
  expect_400(body("\"tool_choice\": \"required\""), "tool_choice", "'tools'");
  expect_400(body("\"tools\": [], \"tool_choice\": \"required\""), "tool_choice", "'tools'");
  expect_400(body(R"("tool_choice": {"type": "function", "function": {"name": "add"}})"), "tool_choice", "no 'tools'");
  const std::string unique = R"([{"type": "function", "function": {"name": "tag", "parameters": {"type": "object",
      "properties": {"t": {"type": "array", "uniqueItems": true}}}}}])";
  expect_400(body("\"tools\": " + unique + ", \"tool_choice\": \"required\""), "tools[0].function.parameters",
             "unsupported keyword 'uniqueItems' at /properties/t");
  expect_400(forced_body("\"required\"", 1, R"("response_format": {"type": "json_object"})"), "tool_choice",
             "'response_format' both constrain the output");
  expect_400(forced_body(R"({"type": "function", "function": {"name": "add"}})", 1, R"("guided_regex": "a+")"),
             "tool_choice", "'guided_regex' both constrain the output");
  // strict: true is served with a forced call (its arguments follow the schema), refused with auto.
  const std::string strict = R"([{"type": "function", "function": {"name": "ping", "strict": true}}])";
  expect_400(body("\"tools\": " + strict), "tools[0].function.strict", "tool_choice");
  const json ok = post(body("\"tools\": " + strict + ", \"tool_choice\": \"required\""));
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "tool_calls") << ok;
  EXPECT_EQ(ok["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}") << ok;
}

TEST_F(ForcedToolCallsHttpTest, ParserNoneRefusesAForcedCall) {
  start("gemma-7b-it");  // no call format in its template: auto reads none
  expect_400(body(std::string("\"tools\": ") + kForcedTools + ", \"tool_choice\": \"required\""), "tool_choice",
             "server.tool_call_parser is none");
  // "auto" stays served: the text is the content.
  script("Blessed are the meek");
  const json r = post(body(std::string("\"tools\": ") + kForcedTools));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
}

}  // namespace
}  // namespace tessera
