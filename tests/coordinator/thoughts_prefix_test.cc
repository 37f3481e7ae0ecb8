// Structured output on a reasoning model (coordinator/api/grammars/thoughts_prefix.h): the
// grammar a constraint compiles to with thoughts before it accepts exactly the strings an
// independent reading accepts — free thoughts up to the first "</think>", whitespace, then the
// constrained text — over random strings built from pieces of the markers, and the constraint
// alone when there are no thoughts.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"

namespace tessera::structured::thoughts_test {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const TokenVocabulary> byte_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

const json kChoices = json{"yes", "no", "<b>"};

bool is_choice(const std::string& s) {
  for (const json& c : kChoices)
    if (s == c.get<std::string>()) return true;
  return false;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string drop_leading_space(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}

// Thoughts up to the first "</think>", whitespace, then a choice.
bool open_thoughts_then_choice(const std::string& s) {
  const size_t close = s.find("</think>");
  return close != std::string::npos && is_choice(drop_leading_space(s.substr(close + 8)));
}

bool optional_thoughts_then_choice(const std::string& s) {
  if (is_choice(s)) return true;
  const std::string rest = drop_leading_space(s);
  return rest.starts_with("<think>") && open_thoughts_then_choice(rest.substr(7));
}

TEST(ThoughtsBeforeGrammar, AcceptsExactlyThoughtsUpToTheFirstCloseThenTheConstrainedText) {
  auto constraint = [](ThoughtsBefore mode) {
    StatusOr<Grammar> g = compile_constraint(ConstraintKind::kChoice, kChoices, mode);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    return TokenConstraint(std::move(g).value(), byte_vocabulary());
  };
  const TokenConstraint none = constraint(ThoughtsBefore::kNone);
  const TokenConstraint optional = constraint(ThoughtsBefore::kOptional);
  const TokenConstraint open = constraint(ThoughtsBefore::kOpen);

  // Pieces that make partial and whole markers next to each other ("<</think>", "</th<", ...).
  const std::vector<std::string> pieces = {"<", "</", "</th", "</thin", "</think", "</think>", "<think>", ">",
                                           "k", "x", " ", "\n", "yes", "no", "<b>", "/"};
  std::mt19937 rng(7);
  int accepted_open = 0, accepted_optional = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s = std::vector<std::string>{"", "", "<think>", "\n<think>"}[rng() % 4];
    const int n = static_cast<int>(rng() % 9);
    for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
    if (rng() % 2 == 0) s += kChoices[rng() % kChoices.size()].get<std::string>();
    EXPECT_EQ(none.matches(s), is_choice(s)) << "none: " << s;
    EXPECT_EQ(open.matches(s), open_thoughts_then_choice(s)) << "open: " << s;
    EXPECT_EQ(optional.matches(s), optional_thoughts_then_choice(s)) << "optional: " << s;
    accepted_open += open_thoughts_then_choice(s);
    accepted_optional += optional_thoughts_then_choice(s) && !is_choice(s);
  }
  // The random strings reach both sides of each reading.
  EXPECT_GT(accepted_open, 500);
  EXPECT_GT(accepted_optional, 100);

  EXPECT_TRUE(open.matches("I think <b> is bold.</think>\n\n<b>"));
  EXPECT_TRUE(open.matches("<<</th</think>yes"));
  EXPECT_FALSE(open.matches("a</think>b</think>yes")) << "the first </think> ends the thoughts";
  EXPECT_FALSE(open.matches("yes")) << "an open prompt's output must close its thoughts";
  EXPECT_TRUE(optional.matches("\n<think>\nhmm</think>no"));
  EXPECT_FALSE(optional.matches("hmm</think>no")) << "thoughts must be opened when the prompt did not";
}

TEST(ThoughtsBeforeGrammar, JsonSchemaAndForcedCallsTakeThemToo) {
  const json schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  StatusOr<Grammar> g = compile_constraint(ConstraintKind::kJsonSchema, schema, ThoughtsBefore::kOptional);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const TokenConstraint c(std::move(g).value(), byte_vocabulary());
  EXPECT_TRUE(c.matches(R"({"a": 1})"));
  EXPECT_TRUE(c.matches("<think>It wants {\"a\"}.</think>\n{\"a\": 1}"));
  EXPECT_FALSE(c.matches("<think>It wants {\"a\"}.</think>\n{\"b\": 1}"));
}

}  // namespace
}  // namespace tessera::structured::thoughts_test
