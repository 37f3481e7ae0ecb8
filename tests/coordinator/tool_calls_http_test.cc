// Tool calls end to end through the real HTTP front end: a real HttpServer and EngineService
// with the kjv-llama tokenizer and real chat templates of tool-use models (the fixtures'
// Qwen 2.5, Llama 3.1 and Mistral-Nemo), and a scripted model — the executor "generates" the
// tokens of a scripted text, then EOS — so the Hermes, Llama 3.1 JSON and Mistral call texts
// come back as OpenAI tool_calls, streaming and not. Also: tool_choice "none", malformed call
// text, a template's raise_exception as a 400, and the prompt the template renders. Forced
// calls (tool_choice "required" / named): the model draws uniformly from the grammar's mask,
// and every sample reads back as valid calls in each format; the refusals are 400s.
#include "tests/coordinator/chat_http_fixture.h"

namespace tessera {
namespace {

using namespace chat_http;  // NOLINT: the fixture's helpers and json aliases

class ToolCallsHttpTest : public ChatHttpTest {};

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
  // strict: true is served with a forced call (its arguments follow the schema) and with auto
  // (StrictToolsWithAuto below); with auto it constrains the output as a forced call does.
  const std::string strict = R"([{"type": "function", "function": {"name": "ping", "strict": true}}])";
  expect_400(body("\"tools\": " + strict + R"(, "response_format": {"type": "json_object"})"), "tools[0].function.strict",
             "'tools[0].function.strict' true and 'response_format' both constrain the output");
  const json ok = post(body("\"tools\": " + strict + ", \"tool_choice\": \"required\""));
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "tool_calls") << ok;
  EXPECT_EQ(ok["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}") << ok;
}

// "auto" with a strict tool: the model answers in text or calls, and a call's arguments follow
// the strict function's schema. A model that writes an answer, or a valid call, writes it
// unchanged; one that writes arguments off the schema is held to it (its script is followed
// only where the grammar allows, so the call it ends with is valid or there is none).
TEST_F(ForcedToolCallsHttpTest, StrictToolsWithAuto) {
  start("qwen2.5-7b-instruct");
  json strict_tools = json::parse(kForcedTools);
  strict_tools[1]["function"]["strict"] = true;  // add; get_weather stays free
  const std::string tools = "\"tools\": " + strict_tools.dump() + ", \"max_tokens\": 120";
  auto follow = [&](const std::string& text) { model_.set_tokens(model_following(tokenizer_->encode(text, false), eos_)); };

  follow("Blessed are the meek");
  json r = post(body(tools));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
  EXPECT_EQ(r["choices"][0]["message"]["content"], " Blessed are the meek") << r;  // the kjv pieces' word start

  const std::string call = "Let me add.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\n</tool_call>";
  follow(call);
  r = post(body(tools));
  ASSERT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r;
  EXPECT_EQ(r["choices"][0]["message"]["content"], " Let me add.\n") << r;
  EXPECT_EQ(json::parse(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"a": 3, "b": 4})")) << r;

  // Off the schema: "a" a string, "b" out of range; get_weather (not strict) takes any object.
  for (const char* off : {R"({"a": "three", "b": 4})", R"({"a": 3, "b": 400})"}) {
    follow(std::string("<tool_call>\n{\"name\": \"add\", \"arguments\": ") + off + "}\n</tool_call>");
    r = post(body(tools));
    const json& choice = r["choices"][0];
    if (choice["finish_reason"] == "tool_calls") {
      for (const json& c : choice["message"]["tool_calls"])
        if (c["function"]["name"] == "add") expect_forced_arguments(c);
    } else if (choice["finish_reason"] == "stop") {  // the grammar ends only outside a call
      EXPECT_EQ(choice["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos) << r;
    } else {
      EXPECT_EQ(choice["finish_reason"], "length") << r;  // max_tokens inside the call: its text is content
    }
  }
  follow("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": 5}}\n</tool_call>");
  r = post(body(tools));
  ASSERT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r;
  EXPECT_EQ(json::parse(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"town": 5})")) << r;

  // Sampled (uniform over the mask): every reply is content or valid calls.
  for (int seed = 1; seed <= 6; ++seed) {
    const json s = post(body(tools + ", \"temperature\": 1, \"seed\": " + std::to_string(seed)));
    if (s["choices"][0]["finish_reason"] == "tool_calls")
      for (const json& c : s["choices"][0]["message"]["tool_calls"])
        if (c["function"]["name"] == "add") expect_forced_arguments(c);
  }
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
