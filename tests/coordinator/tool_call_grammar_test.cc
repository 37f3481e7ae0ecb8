// The grammar of forced tool calls (coordinator/api/tool_calls/tool_call_grammar.h): random walks
// through each format's grammar — every step a token drawn from the matcher's mask — end in
// texts the format's parser reads back as calls only (no content), each naming a function of
// the tools, with arguments that hold the schema's required keys and types; a named function
// is the only one written, parallel_tool_calls false writes one call. Mistral's [TOOL_CALLS]
// as a special token: the matcher allows it once the vocabulary gives it its text. And the
// compile errors: the format none, a parameters schema the compiler cannot take, not an object.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/engine/structured/token_constraint.h"
#include "coordinator/api/tool_calls/tool_call_grammar.h"
#include "coordinator/api/tool_calls/tool_call_stream.h"

namespace tessera {
namespace {

using ojson = nlohmann::ordered_json;
using structured::MatchState;
using structured::TokenConstraint;
using structured::TokenVocabulary;

const char* const kGrammarTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"},
    "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"]}}},
  {"type": "function", "function": {"name": "ping"}}])";

// Every single byte, some longer pieces that cross the format's fixed text, and one special
// token (id 256 + pieces: no bytes) for Mistral's marker.
std::vector<std::string> grammar_test_tokens() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"<tool_call>", "</tool_call>", "\n<", "{\"name\": \"", "\", \"arguments\": {", "\"city\"",
                        "\": ", "}}", "}\n", "; ", "[TOOL", "_CALLS]", "Paris", "12"})
    t.push_back(s);
  t.push_back("");  // the special token
  return t;
}

// Whether `args` (JSON text) holds what the tool's schema requires.
void expect_valid_arguments(const std::string& name, const std::string& args, const std::string& text) {
  const ojson a = ojson::parse(args, nullptr, false);
  ASSERT_TRUE(a.is_object()) << args << "\nin " << text;
  if (name == "get_weather") {
    ASSERT_TRUE(a.contains("city") && a["city"].is_string()) << args;
    EXPECT_LE(a["city"].get<std::string>().size(), 16u * 4) << args;
    if (a.contains("unit")) { EXPECT_TRUE(a["unit"] == "c" || a["unit"] == "f") << args; }
    for (auto it = a.begin(); it != a.end(); ++it) EXPECT_TRUE(it.key() == "city" || it.key() == "unit") << args;
  } else if (name == "add") {
    ASSERT_TRUE(a.contains("a") && a["a"].is_number_integer()) << args;
    ASSERT_TRUE(a.contains("b") && a["b"].is_number_integer()) << args;
    EXPECT_TRUE(a["b"] >= 0 && a["b"] <= 99) << args;
  } else {
    EXPECT_EQ(name, "ping") << text;
    EXPECT_TRUE(a.empty()) << args;  // no parameters: no arguments
  }
}

// A random walk through the constraint: a token from the mask each step; ends where the
// grammar may (with probability 1/end_one_in there, always when nothing else may follow).
// `favour_pieces` draws from the longer pieces (the call markers among them) half the time, so
// grammars with free text get to write calls. Empty when it ran out of steps.
std::string walk(const TokenConstraint& c, std::mt19937& rng, unsigned end_one_in = 3, bool favour_pieces = false) {
  MatchState s = c.initial();
  std::string text;
  std::vector<uint32_t> mask;
  for (int step = 0; step < 4000; ++step) {
    c.fill_mask(s, &mask);
    std::vector<int32_t> allowed, pieces;
    for (size_t w = 0; w < mask.size(); ++w)
      for (int b = 0; b < 32; ++b)
        if (mask[w] >> b & 1u) allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(b)));
    if (favour_pieces)
      for (int32_t t : allowed)
        if (t >= 256) pieces.push_back(t);
    if (c.can_end(s) && (allowed.empty() || rng() % end_one_in == 0)) return text;
    EXPECT_FALSE(allowed.empty()) << "a dead end after " << text;
    if (allowed.empty()) return "";
    const std::vector<int32_t>& from = !pieces.empty() && rng() % 2 == 0 ? pieces : allowed;
    const int32_t t = from[rng() % from.size()];
    text += c.vocabulary().bytes(t);
    s = c.advance_token(s, t);
    EXPECT_FALSE(c.is_dead(s)) << text;
  }
  return "";
}

struct GrammarCase {
  ToolCallFormat format;
  std::string only;  // named function
  bool parallel;
};

TEST(ToolCallGrammar, SampledCallsParseBackAsValidCallsInEveryFormat) {
  const ojson tools = ojson::parse(kGrammarTools);
  auto vocab = std::make_shared<const TokenVocabulary>(grammar_test_tokens());
  for (const GrammarCase& gc : std::vector<GrammarCase>{{ToolCallFormat::kHermes, "", true},
                                                        {ToolCallFormat::kHermes, "add", true},
                                                        {ToolCallFormat::kHermes, "", false},
                                                        {ToolCallFormat::kLlama3Json, "", true},
                                                        {ToolCallFormat::kLlama3Json, "get_weather", true},
                                                        {ToolCallFormat::kLlama3Json, "", false},
                                                        {ToolCallFormat::kMistral, "", true},
                                                        {ToolCallFormat::kMistral, "ping", true},
                                                        {ToolCallFormat::kMistral, "", false}}) {
    SCOPED_TRACE(std::string(tool_call_format_name(gc.format)) + " named '" + gc.only + "' parallel " +
                 std::to_string(gc.parallel));
    ToolCallGrammarSpec spec{gc.format, &tools, gc.only, gc.parallel};
    std::string param;
    auto grammar = compile_tool_call_grammar(spec, &param);
    ASSERT_TRUE(grammar.is_ok()) << grammar.status().to_string();
    const TokenConstraint c(std::move(grammar).value(), vocab);
    const auto parser = make_tool_call_parser(gc.format);
    std::mt19937 rng(7);
    std::set<std::string> names;
    size_t most_calls = 0;
    int walks = 0;
    for (int i = 0; i < 60; ++i) {
      const std::string text = walk(c, rng);
      if (text.empty()) continue;
      ++walks;
      ASSERT_TRUE(c.matches(text)) << text;
      const ParsedToolCalls parsed = parse_tool_calls(*parser, text, gc.parallel);
      EXPECT_FALSE(parsed.content.has_value()) << "content " << *parsed.content << "\nfrom " << text;
      ASSERT_FALSE(parsed.calls.empty()) << text;
      if (!gc.parallel || !gc.only.empty()) { EXPECT_EQ(parsed.calls.size(), 1u) << text; }
      most_calls = std::max(most_calls, parsed.calls.size());
      for (const ToolCallDelta& d : parsed.calls) {
        if (!gc.only.empty()) { EXPECT_EQ(d.call.name, gc.only) << text; }
        names.insert(d.call.name);
        expect_valid_arguments(d.call.name, d.call.arguments, text);
      }
      // A stream split at every 7th byte reads the same calls.
      ToolCallStream stream(parser.get(), gc.parallel);
      std::vector<ToolCallDelta> deltas;
      for (size_t at = 0; at < text.size(); at += 7)
        for (ToolCallDelta& d : stream.feed(std::string_view(text).substr(at, 7))) deltas.push_back(std::move(d));
      for (ToolCallDelta& d : stream.finish()) deltas.push_back(std::move(d));
      ASSERT_EQ(deltas.size(), parsed.calls.size()) << text;
      for (size_t k = 0; k < deltas.size(); ++k) {
        EXPECT_TRUE(deltas[k].is_call);
        EXPECT_EQ(deltas[k].call.arguments, parsed.calls[k].call.arguments);
      }
    }
    EXPECT_GE(walks, 40);
    if (gc.only.empty()) { EXPECT_EQ(names.size(), 3u) << "every function gets called in 60 walks"; }
    if (gc.only.empty() && gc.parallel) { EXPECT_GE(most_calls, 2u) << "parallel calls are written"; }
  }
}

// "auto" with strict tools: the grammar lets the model write content, and every call the
// parser reads from a sampled output is one the grammar wrote — a strict function's arguments
// hold its schema, another's are any object. Both kinds of output come up, and with
// parallel_tool_calls false at most one call.
TEST(ToolCallGrammar, ContentAndStrictCallsInEveryFormat) {
  ojson tools = ojson::parse(kGrammarTools);
  tools[0]["function"]["strict"] = true;  // get_weather
  tools[1]["function"]["strict"] = true;  // add; ping is not strict
  auto vocab = std::make_shared<const TokenVocabulary>(grammar_test_tokens());
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    for (bool parallel : {true, false}) {
      SCOPED_TRACE(std::string(tool_call_format_name(format)) + " parallel " + std::to_string(parallel));
      ToolCallGrammarSpec spec{format, &tools, "", parallel};
      spec.content_allowed = true;
      std::string param;
      auto grammar = compile_tool_call_grammar(spec, &param);
      ASSERT_TRUE(grammar.is_ok()) << grammar.status().to_string();
      const TokenConstraint c(std::move(grammar).value(), vocab);
      const auto parser = make_tool_call_parser(format);
      std::mt19937 rng(11);
      int with_calls = 0, content_only = 0;
      size_t most_calls = 0;
      for (int i = 0; i < 200; ++i) {
        const std::string text = walk(c, rng, 12, /*favour_pieces=*/true);
        if (text.empty()) continue;
        ASSERT_TRUE(c.matches(text)) << text;
        const ParsedToolCalls parsed = parse_tool_calls(*parser, text, parallel);
        (parsed.calls.empty() ? content_only : with_calls) += 1;
        most_calls = std::max(most_calls, parsed.calls.size());
        for (const ToolCallDelta& d : parsed.calls) {
          if (d.call.name == "ping") {
            EXPECT_TRUE(ojson::parse(d.call.arguments, nullptr, false).is_object()) << text;
          } else {
            expect_valid_arguments(d.call.name, d.call.arguments, text);
          }
        }
      }
      EXPECT_GE(with_calls, 4) << "calls get written";
      EXPECT_GE(content_only, 4) << "content alone gets written";
      if (!parallel) { EXPECT_LE(most_calls, 1u); }
    }
  }
  // Content may not hold a marker outside a call: the texts the parser would read as calls.
  ToolCallGrammarSpec spec{ToolCallFormat::kHermes, &tools, "", true};
  spec.content_allowed = true;
  std::string param;
  const TokenConstraint hermes(compile_tool_call_grammar(spec, &param).value(), vocab);
  EXPECT_TRUE(hermes.matches("I will add. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call> done"));
  EXPECT_TRUE(hermes.matches("a <tool_cal> b <tool"));
  EXPECT_FALSE(hermes.matches("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"x\", \"b\": 2}}\n</tool_call>"));
  EXPECT_FALSE(hermes.matches("text <tool_call> more text"));
  spec.format = ToolCallFormat::kLlama3Json;
  const TokenConstraint llama(compile_tool_call_grammar(spec, &param).value(), vocab);
  EXPECT_TRUE(llama.matches("The sum is 3. {not a call}"));
  EXPECT_TRUE(llama.matches("  <|python_ta"));
  EXPECT_FALSE(llama.matches(" {\"a\": 1}"));
  EXPECT_FALSE(llama.matches("<|python_tag|> hello"));
  // Harmony's calls are special-token messages: strict tools are refused there, naming why.
  spec.format = ToolCallFormat::kHarmony;
  auto refused = compile_tool_call_grammar(spec, &param);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("strict tools"), std::string::npos) << refused.status().to_string();
}

// Texts the grammar allows at its edges: a string holding the close tag, escapes in the name.
TEST(ToolCallGrammar, CloseTagInsideAnArgumentStringStaysInTheCall) {
  const ojson tools = ojson::parse(kGrammarTools);
  ToolCallGrammarSpec spec{ToolCallFormat::kHermes, &tools, "", true};
  std::string param;
  auto grammar = compile_tool_call_grammar(spec, &param);
  ASSERT_TRUE(grammar.is_ok());
  const TokenConstraint c(std::move(grammar).value(), std::make_shared<const TokenVocabulary>(grammar_test_tokens()));
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"</tool_call>\"}}\n</tool_call>";
  ASSERT_TRUE(c.matches(text));
  const auto parser = make_tool_call_parser(ToolCallFormat::kHermes);
  const ParsedToolCalls parsed = parse_tool_calls(*parser, text, true);
  ASSERT_EQ(parsed.calls.size(), 1u) << (parsed.content ? *parsed.content : "");
  EXPECT_EQ(parsed.calls[0].call.arguments, R"({"city":"</tool_call>"})");
  EXPECT_FALSE(parsed.content.has_value());
  // Streamed byte by byte: the same.
  ToolCallStream stream(parser.get(), true);
  int calls = 0;
  for (char ch : text)
    for (const ToolCallDelta& d : stream.feed(std::string(1, ch))) calls += d.is_call ? 1 : 100;
  for (const ToolCallDelta& d : stream.finish()) calls += d.is_call ? 1 : 100;
  EXPECT_EQ(calls, 1);
  // A name that needs escaping is written escaped and read back as it was.
  const ojson odd = ojson::parse(R"([{"type": "function", "function": {"name": "say \"hi\"\\now"}}])");
  ToolCallGrammarSpec named{ToolCallFormat::kMistral, &odd, "", false};
  auto g2 = compile_tool_call_grammar(named, &param);
  ASSERT_TRUE(g2.is_ok());
  const TokenConstraint c2(std::move(g2).value(), std::make_shared<const TokenVocabulary>(grammar_test_tokens()));
  const std::string mistral = R"([TOOL_CALLS][{"name": "say \"hi\"\\now", "arguments": {}}])";
  ASSERT_TRUE(c2.matches(mistral));
  const ParsedToolCalls p2 = parse_tool_calls(*make_tool_call_parser(ToolCallFormat::kMistral), mistral, false);
  ASSERT_EQ(p2.calls.size(), 1u);
  EXPECT_EQ(p2.calls[0].call.name, "say \"hi\"\\now");
}

// [TOOL_CALLS] is a special token in real Mistral vocabularies: no bytes, so a grammar
// cannot ask for it — until the vocabulary gives it its text. Then the first mask allows it
// (and the ordinary pieces that spell it), and after it the array follows.
TEST(ToolCallGrammar, MistralMarkerAsASpecialTokenIsAllowedFirst) {
  const ojson tools = ojson::parse(kGrammarTools);
  std::vector<std::string> tokens = grammar_test_tokens();
  const auto special = static_cast<int32_t>(tokens.size() - 1);
  auto plain = std::make_shared<const TokenVocabulary>(tokens);
  auto with_marker = plain->with_token_bytes(special, "[TOOL_CALLS]");
  EXPECT_EQ(plain->bytes(special), "");
  EXPECT_EQ(with_marker->bytes(special), "[TOOL_CALLS]");
  ToolCallGrammarSpec spec{ToolCallFormat::kMistral, &tools, "ping", true};
  std::string param;
  for (bool give_bytes : {false, true}) {
    auto grammar = compile_tool_call_grammar(spec, &param);
    ASSERT_TRUE(grammar.is_ok());
    const TokenConstraint c(std::move(grammar).value(), give_bytes ? with_marker : plain);
    std::vector<uint32_t> mask;
    c.fill_mask(c.initial(), &mask);
    const bool allowed = mask.size() > static_cast<size_t>(special / 32) && (mask[special / 32] >> (special % 32) & 1u);
    EXPECT_EQ(allowed, give_bytes);
    EXPECT_TRUE(mask['[' / 32] >> ('[' % 32) & 1u);  // the ordinary spelling
    if (!give_bytes) continue;
    MatchState s = c.advance_token(c.initial(), special);
    ASSERT_FALSE(c.is_dead(s));
    s = c.advance_bytes(s, R"([{"name": "ping", "arguments": {}}])");
    EXPECT_TRUE(c.can_end(s));
    EXPECT_TRUE(c.must_end(s));
  }
}

TEST(ToolCallGrammar, SchemasItCannotTakeNameTheFieldAndKeyword) {
  const ojson tools = ojson::parse(R"([
    {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "tags", "parameters": {"type": "object",
      "properties": {"t": {"type": "array", "uniqueItems": true}}}}},
    {"type": "function", "function": {"name": "text", "parameters": {"type": "string"}}}])");
  std::string param;
  ToolCallGrammarSpec spec{ToolCallFormat::kHermes, &tools, "tags", true};
  auto g = compile_tool_call_grammar(spec, &param);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(param, "tools[1].function.parameters");
  EXPECT_NE(g.status().message().find("unsupported keyword 'uniqueItems' at /properties/t"), std::string::npos)
      << g.status().message();
  EXPECT_NE(g.status().message().find("'tags'"), std::string::npos) << g.status().message();
  spec.only_function = "text";
  g = compile_tool_call_grammar(spec, &param);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(param, "tools[2].function.parameters.type");
  spec.only_function = "ok";  // only the named function's schema is compiled
  EXPECT_TRUE(compile_tool_call_grammar(spec, &param).is_ok());
  spec.only_function = "";  // "required": every function's
  EXPECT_FALSE(compile_tool_call_grammar(spec, &param).is_ok());
  spec.format = ToolCallFormat::kNone;
  g = compile_tool_call_grammar(spec, &param);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(param, "tool_choice");
}

}  // namespace
}  // namespace tessera
