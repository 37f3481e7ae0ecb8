// The tool-call parsers (coordinator/api/tool_calls/): Hermes/Qwen, Llama 3.1 JSON and Mistral
// output read into calls and content — complete, several calls, malformed (stays content) —
// and, through ToolCallStream, the same result when the text is streamed split at every
// byte boundary (and one byte at a time).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "coordinator/api/tool_calls/tool_call_stream.h"

namespace tessera {
namespace {

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};
struct Result {
  std::optional<std::string> content;
  std::vector<Call> calls;
  bool operator==(const Result&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "content=" << (r.content ? "\"" + *r.content + "\"" : "null") << " calls=[";
  for (const Call& c : r.calls) os << c.name << c.arguments << ";";
  return os << "]";
}

Result whole(ToolCallFormat format, const std::string& text, bool parallel = true) {
  auto parser = make_tool_call_parser(format);
  ParsedToolCalls p = parse_tool_calls(*parser, text, parallel);
  Result r;
  r.content = p.content;
  for (const ToolCallDelta& d : p.calls) r.calls.push_back({d.call.name, d.call.arguments});
  return r;
}

// The stream's deltas gathered as a client would: content pieces joined, calls in order
// with consecutive indexes and ids of the format's shape.
Result streamed(ToolCallFormat format, const std::vector<std::string>& pieces) {
  auto parser = make_tool_call_parser(format);
  ToolCallStream s(parser.get(), true);
  std::vector<ToolCallDelta> all;
  for (const std::string& p : pieces)
    for (ToolCallDelta& d : s.feed(p)) all.push_back(std::move(d));
  for (ToolCallDelta& d : s.finish()) all.push_back(std::move(d));
  Result r;
  std::string content;
  bool any_content = false;
  for (const ToolCallDelta& d : all) {
    if (d.is_call) {
      EXPECT_EQ(d.index, static_cast<int>(r.calls.size()));
      EXPECT_EQ(d.id.size(), format == ToolCallFormat::kMistral ? 9u : 29u) << d.id;
      r.calls.push_back({d.call.name, d.call.arguments});
    } else {
      EXPECT_FALSE(d.content.empty());
      content += d.content;
      any_content = true;
    }
  }
  if (any_content || r.calls.empty()) r.content = content;
  return r;
}

// Every split into two pieces, and one byte at a time, stream to what the whole text parses to.
void expect_split_invariant(ToolCallFormat format, const std::string& text) {
  const Result expected = whole(format, text);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    EXPECT_EQ(streamed(format, {text.substr(0, cut), text.substr(cut)}), expected) << "cut at " << cut << ": " << text;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(streamed(format, bytes), expected) << "byte by byte: " << text;
}

TEST(ToolCallParser, HermesCompleteMultipleAndMalformed) {
  const auto k = ToolCallFormat::kHermes;
  EXPECT_EQ(whole(k, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>"),
            (Result{std::nullopt, {{"get_weather", R"({"city":"Paris","unit":"c"})"}}}));
  EXPECT_EQ(whole(k, "Let me look.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
                     "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, \"}\"]}}</tool_call>"),
            (Result{"Let me look.\n\n", {{"a", "{}"}, {"b", R"({"x":[1,"}"]})"}}}));
  // Malformed: not JSON, no name, arguments not an object: the block stays content.
  for (const std::string bad : {"<tool_call>{\"name\": \"a\", </tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                                "<tool_call>{\"name\": \"a\", \"arguments\": 5}</tool_call>", "<tool_call>{\"name\": \"a\""})
    EXPECT_EQ(whole(k, bad), (Result{bad, {}})) << bad;
  // A malformed block beside a good one: the good one is a call, the bad one content.
  EXPECT_EQ(whole(k, "<tool_call>nope</tool_call><tool_call>{\"name\": \"f\"}</tool_call>"),
            (Result{"<tool_call>nope</tool_call>", {{"f", "{}"}}}));
  // Unclosed at the end but whole JSON: a call (the model stopped after it).
  EXPECT_EQ(whole(k, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"), (Result{std::nullopt, {{"f", R"({"a":1})"}}}));
  // No calls: the text as it is, whitespace included.
  EXPECT_EQ(whole(k, "  plain <tool text\n"), (Result{"  plain <tool text\n", {}}));
  EXPECT_EQ(whole(k, ""), (Result{"", {}}));
  // Arguments sent as JSON text are read as the object they encode; key order is kept.
  EXPECT_EQ(whole(k, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"z\\\": 1, \\\"a\\\": 2}\"}</tool_call>"),
            (Result{std::nullopt, {{"f", R"({"z":1,"a":2})"}}}));
}

TEST(ToolCallParser, HermesStreamsTheSameSplitAtEveryByte) {
  for (const std::string text : {
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "Sure.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> and <tool_call>{\"name\": \"b\"}</tool_call>",
           "<tool_call>broken</tool_call> text <tool_call>{\"name\": \"c\", \"arguments\": {\"q\": \"</tool_call>\"}}",
           "no calls, just < and <tool and <tool_cal",
           "\n\n<tool_call>{\"name\": \"a\"}</tool_call>\n",
       })
    expect_split_invariant(ToolCallFormat::kHermes, text);
}

TEST(ToolCallParser, Llama3JsonCompleteMultipleAndMalformed) {
  const auto k = ToolCallFormat::kLlama3Json;
  EXPECT_EQ(whole(k, "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris, France\"}}"),
            (Result{std::nullopt, {{"get_weather", R"({"location":"Paris, France"})"}}}));
  EXPECT_EQ(whole(k, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": 1}}<|eom_id|>"),
            (Result{std::nullopt, {{"a", "{}"}, {"b", R"({"x":1})"}}}));
  // An answer that is JSON but not a call, text first, or trailing text: content.
  for (const std::string text : {"{\"answer\": 42}", "Here: {\"name\": \"a\", \"parameters\": {}}",
                                 "{\"name\": \"a\", \"parameters\": {}} and more", "{\"name\": \"a\", \"parameters\": {",
                                 "{\"name\": \"a\", \"parameters\": {}, \"extra\": 1}"})
    EXPECT_EQ(whole(k, text), (Result{text, {}})) << text;
}

TEST(ToolCallParser, Llama3JsonStreamsTheSameSplitAtEveryByte) {
  for (const std::string text : {"{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
                                 " <|python_tag|>{\"name\": \"a\", \"parameters\": {}};{\"name\": \"b\", \"parameters\": {}}",
                                 "The answer is 4.", "{\"not\": \"a call\"}", "<|pyth", "  "})
    expect_split_invariant(ToolCallFormat::kLlama3Json, text);
}

TEST(ToolCallParser, MistralCompleteMultipleAndMalformed) {
  const auto k = ToolCallFormat::kMistral;
  EXPECT_EQ(whole(k, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"),
            (Result{std::nullopt, {{"get_weather", R"({"city":"Paris"})"}}}));
  EXPECT_EQ(whole(k, "Checking.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"y\": \"]\"}}]"),
            (Result{"Checking.", {{"a", "{}"}, {"b", R"({"y":"]"})"}}}));
  for (const std::string bad : {"[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"oops\": 1}]", "[TOOL_CALLS] nothing",
                                "[TOOL_CALLS] [{\"name\": \"a\"", "[TOOL_CALLS] []", "[TOOL_CALLS]"})
    EXPECT_EQ(whole(k, bad), (Result{bad, {}})) << bad;
}

TEST(ToolCallParser, MistralStreamsTheSameSplitAtEveryByte) {
  for (const std::string text : {"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
                                 "Ok [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}] done [TOOL_CALLS] {\"name\": \"b\"}",
                                 "[TOOL_CALLS] broken [TOOL_CALL", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, 7]"})
    expect_split_invariant(ToolCallFormat::kMistral, text);
}

// gpt-oss: what the harmony reader writes for a message to a function (reasoning/harmony.h).
TEST(ToolCallParser, HarmonyCallBlocksAndWhatStaysContent) {
  const auto k = ToolCallFormat::kHarmony;
  EXPECT_EQ(whole(k, "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Paris\"}<|call|>"),
            (Result{std::nullopt, {{"get_weather", R"({"city":"Paris"})"}}}));
  EXPECT_EQ(whole(k, "Checking.<|channel|>commentary to=functions.a<|message|>{}<|call|>"
                     "<|channel|>commentary to=functions.b<|message|>{\"x\": [1]}<|call|>"),
            (Result{"Checking.", {{"a", "{}"}, {"b", R"({"x":[1]})"}}}));
  // Not a function (a built-in tool), arguments not an object, an unclosed block: content.
  for (const std::string bad : {"<|channel|>commentary to=browser.search<|message|>{\"q\": 1}<|call|>",
                                "<|channel|>commentary to=functions.f<|message|>[1]<|call|>",
                                "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}"})
    EXPECT_EQ(whole(k, bad), (Result{bad, {}})) << bad;
  for (const std::string text : {"<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Paris\"}<|call|>",
                                 "A <|channel|>commentary to=functions.a<|message|>{}<|call|> B <|chan",
                                 "<|channel|>commentary to=functions.f<|message|>nope<|call|>"})
    expect_split_invariant(k, text);
}

TEST(ToolCallParser, ParallelCallsOffReadsOnlyTheFirstCall) {
  const std::string text = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>";
  EXPECT_EQ(whole(ToolCallFormat::kHermes, text, /*parallel=*/false),
            (Result{"<tool_call>{\"name\": \"b\"}</tool_call>", {{"a", "{}"}}}));
}

TEST(ToolCallParser, AutoIsDecidedFromTheTemplateText) {
  EXPECT_EQ(tool_call_format_for_template("... <tool_call>\n{\"name\": ..."), ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format_for_template("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(tool_call_format_for_template("<|start_header_id|> {\"name\": function name, \"parameters\": ...}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(tool_call_format_for_template("{{ bos_token }}{{ m.content }}"), ToolCallFormat::kNone);
  EXPECT_FALSE(tool_call_format_from_name("hermes2").is_ok());
  EXPECT_FALSE(tool_call_format_from_name("auto").value().has_value());
  EXPECT_EQ(*tool_call_format_from_name("mistral").value(), ToolCallFormat::kMistral);
}

}  // namespace
}  // namespace tessera
