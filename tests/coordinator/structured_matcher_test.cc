// The token matcher (coordinator/engine/structured/token_constraint.h): its cached, trie-walked
// masks must equal the brute-force answer (advance the state by each token's bytes and see
// whether it survives) at every step of random walks through several grammars, over a
// vocabulary whose tokens cross grammar terminals and UTF-8 boundaries, over one dense enough
// that whole subtrees are allowed at once, and over the real kjv-llama vocabulary when the
// fixtures are there. Masks computed on several threads at once equal the serial ones.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "coordinator/engine/structured/mask_pool.h"
#include "coordinator/api/grammars/request_constraint.h"
#include "coordinator/engine/structured/sequence_constraint.h"
#include "coordinator/engine/structured/token_constraint.h"
#include "tests/test_support.h"

namespace tessera::structured {
namespace {

using json = nlohmann::ordered_json;

// Tokens that span terminals ("\":", "},{"), partial UTF-8 ("\xC3", "\xA9x"), whole words,
// whitespace runs, and a few that no grammar here allows.
std::vector<std::string> tricky_tokens() {
  std::vector<std::string> t = {"", "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "  ", "\n  ", "\":", "\": ",
                                "\",", "\"}", "},{", "}]", "[{", "{\"", "\"a", "a\"", "ab", "abc", "name", "\"name\"",
                                "true", "tr", "ue", "false", "null", "nu", "ll", "0", "1", "12", "-", "-1", ".", ".5",
                                "5", "e", "E+", "\\", "\\\"", "\\n", "\\u", "00", "e9", "\xC3", "\xA9", "\xC3\xA9",
                                "\xA9x", "x", "yes", "no", "y", "es", "<|eot|>", "\t"};
  for (char c = 'a'; c <= 'z'; ++c) t.push_back(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) t.push_back(std::string(1, c) + "\"");
  return t;
}

// The tricky tokens, plus every string of 1 to 4 bytes over "ab1 " alone, after a quote and
// after "é": subtrees of 16 and more tokens (TokenVocabulary::kSubtreeSetMinTokens) that read
// only a JSON string's plain characters, which the matcher allows whole, next to tokens that
// end, escape or break the string.
std::vector<std::string> dense_tokens() {
  std::vector<std::string> all = tricky_tokens(), level = {""}, plain;
  for (int len = 1; len <= 4; ++len) {
    std::vector<std::string> longer;
    for (const std::string& prefix : level)
      for (char c : std::string("ab1 ")) longer.push_back(prefix + c);
    plain.insert(plain.end(), longer.begin(), longer.end());
    level = std::move(longer);
  }
  for (const char* lead : {"", "\"", "\xC3\xA9"})
    for (const std::string& p : plain) all.push_back(lead + p);
  return all;
}

void expect_masks_match_brute_force(const TokenConstraint& c, int walks, uint64_t seed, const std::string& what) {
  std::mt19937_64 rng(seed);
  const int64_t vocab = c.vocabulary().size();
  for (int w = 0; w < walks; ++w) {
    MatchState state = c.initial();
    for (int step = 0; step < 40 && !c.must_end(state); ++step) {
      std::vector<uint32_t> mask;
      c.fill_mask(state, &mask);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab; ++t) {
        const bool brute = !c.is_dead(c.advance_token(state, t));
        const bool masked = ((mask[static_cast<size_t>(t) / 32] >> (t % 32)) & 1u) != 0;
        ASSERT_EQ(masked, brute) << what << ": walk " << w << " step " << step << " token " << t << " ("
                                 << json(c.vocabulary().bytes(t)).dump() << ")";
        if (brute) allowed.push_back(t);
      }
      if (allowed.empty()) break;
      state = c.advance_token(state, allowed[rng() % allowed.size()]);
    }
  }
}

std::vector<std::pair<ConstraintKind, json>> grammars() {
  return {
      {ConstraintKind::kJsonObject, nullptr},
      {ConstraintKind::kJsonSchema, json::parse(R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
          "n": {"type": "integer", "minimum": -20, "maximum": 120},
          "list": {"type": "array", "items": {"$ref": "#"}, "maxItems": 3}},
          "required": ["name"], "additionalProperties": false})")},
      {ConstraintKind::kJsonSchema, json::parse(R"({"anyOf": [{"type": "number"}, {"enum": ["yes", null]},
          {"type": "string", "pattern": "[a-c]+\\d"}]})")},
      {ConstraintKind::kRegex, "(ab|a)+(\xC3\xA9|x)*"},
      {ConstraintKind::kChoice, json{"yes", "no", "yesno"}},
      {ConstraintKind::kGrammar, "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= root | [0-9]+"},
  };
}

TEST(StructuredMatcher, MasksEqualBruteForceOnTrickyTokens) {
  auto vocab = std::make_shared<const TokenVocabulary>(tricky_tokens());
  uint64_t seed = 1;
  for (const auto& [kind, value] : grammars()) {
    StatusOr<Grammar> g = compile_constraint(kind, value);
    ASSERT_TRUE(g.is_ok()) << value.dump() << ": " << g.status().to_string();
    const TokenConstraint c(std::move(g).value(), vocab);
    expect_masks_match_brute_force(c, 30, seed++, value.dump());
  }
}

TEST(StructuredMatcher, MasksEqualBruteForceOnADenseVocabulary) {
  auto vocab = std::make_shared<const TokenVocabulary>(dense_tokens());
  uint64_t seed = 50;
  for (const auto& [kind, value] : grammars()) {
    StatusOr<Grammar> g = compile_constraint(kind, value);
    ASSERT_TRUE(g.is_ok()) << value.dump() << ": " << g.status().to_string();
    const TokenConstraint c(std::move(g).value(), vocab);
    expect_masks_match_brute_force(c, 8, seed++, value.dump());
  }
}

// The scheduler computes a step's masks on several threads (MaskPool) while sequences of the
// same grammar share its caches: 36 sequences over the six grammars, each step's masks and
// token advances all run at once on 4 threads, must see exactly the masks that one thread
// computes for the same token sequences over fresh constraints.
TEST(StructuredMatcher, MasksComputedInParallelEqualSerialOnes) {
  auto vocab = std::make_shared<const TokenVocabulary>(dense_tokens());
  const auto specs = grammars();
  auto constraints = [&] {
    std::vector<std::shared_ptr<const TokenConstraint>> out;
    for (const auto& [kind, value] : specs)
      out.push_back(std::make_shared<const TokenConstraint>(compile_constraint(kind, value).value(), vocab));
    return out;
  };
  constexpr size_t kSeqs = 36;
  constexpr int kSteps = 30;
  // Serial reference: each sequence's tokens (a random allowed one per step) and masks.
  const auto serial = constraints();
  std::vector<std::vector<int32_t>> tokens(kSeqs);
  std::vector<std::vector<std::vector<uint32_t>>> masks(kSeqs);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < kSeqs; ++i) {
    SequenceConstraint seq(serial[i % serial.size()], {0});
    std::string error;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<uint32_t>& mask = seq.next_mask();
      std::vector<int32_t> allowed;
      for (size_t w = 0; w < mask.size(); ++w)
        for (uint32_t b = mask[w]; b != 0; b &= b - 1) allowed.push_back(static_cast<int32_t>(w * 32 + std::countr_zero(b)));
      ASSERT_FALSE(allowed.empty());
      masks[i].push_back(mask);
      tokens[i].push_back(allowed[rng() % allowed.size()]);
      if (seq.on_token(tokens[i].back(), &error) != ConstraintVerdict::kContinue) break;
    }
  }
  // The same walks, every step's sequences at once.
  const auto shared = constraints();
  std::vector<SequenceConstraint> seqs;
  for (size_t i = 0; i < kSeqs; ++i) seqs.emplace_back(shared[i % shared.size()], std::vector<int32_t>{0});
  std::vector<std::vector<uint32_t>> got(kSeqs);
  MaskPool pool(4);
  for (size_t step = 0; step < static_cast<size_t>(kSteps); ++step) {
    pool.run(kSeqs, [&](size_t i) {
      if (step >= tokens[i].size()) return;
      got[i] = seqs[i].next_mask();
      std::string error;
      seqs[i].on_token(tokens[i][step], &error);  // the next mask too, racing the others
    });
    for (size_t i = 0; i < kSeqs; ++i) {
      if (step < tokens[i].size()) {
        ASSERT_EQ(got[i], masks[i][step]) << "sequence " << i << " step " << step;
      }
    }
  }
}

TEST(StructuredMatcher, MaskPoolRunsEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    MaskPool pool(threads);
    for (size_t n : {0, 1, 2, 3, 17, 500}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<std::atomic<int>> hits(n);
        pool.run(n, [&](size_t i) { hits[i].fetch_add(1); });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n " << n << ", index " << i;
      }
    }
  }
}

TEST(StructuredMatcher, MasksEqualBruteForceOnTheKjvVocabulary) {
  const std::string dir = testing::fixtures_dir() + "/kjv-llama";
  if (testing::fixtures_dir().empty()) GTEST_SKIP() << "no fixtures (../shared/fixtures)";
  StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::load(dir);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto vocab = TokenVocabulary::from_tokenizer(*tok.value());
  // Byte pieces <0x7B> are "{"; "▁the" is " the"; special tokens have no bytes.
  EXPECT_EQ(vocab->bytes(tok.value()->token_to_id("<0x7B>")), "{");
  EXPECT_EQ(vocab->bytes(tok.value()->token_to_id("\xE2\x96\x81the")), " the");
  EXPECT_EQ(vocab->bytes(2), "");
  uint64_t seed = 100;
  for (const auto& [kind, value] : grammars()) {
    StatusOr<Grammar> g = compile_constraint(kind, value);
    ASSERT_TRUE(g.is_ok());
    const TokenConstraint c(std::move(g).value(), vocab);
    expect_masks_match_brute_force(c, 6, seed++, value.dump());
  }
}

TEST(StructuredMatcher, SequenceConstraintAllowsEndOnlyWhereTheGrammarEnds) {
  auto vocab = std::make_shared<const TokenVocabulary>(std::vector<std::string>{"", "a", "b", "ab"});
  StatusOr<Grammar> g = compile_constraint(ConstraintKind::kRegex, "ab?");
  ASSERT_TRUE(g.is_ok());
  auto c = std::make_shared<const TokenConstraint>(std::move(g).value(), vocab);
  SequenceConstraint seq(c, {0});  // token 0 ends the choice
  EXPECT_EQ(seq.next_mask(), std::vector<uint32_t>{0b1010u}) << "a or ab, not the end, not b";
  std::string error;
  EXPECT_EQ(seq.on_token(1, &error), ConstraintVerdict::kContinue);
  EXPECT_EQ(seq.next_mask(), std::vector<uint32_t>{0b0101u}) << "b or the end";
  SequenceConstraint done = seq;
  EXPECT_EQ(done.on_token(2, &error), ConstraintVerdict::kComplete) << "nothing may follow \"ab\"";
  EXPECT_EQ(seq.on_token(0, &error), ConstraintVerdict::kComplete);
  SequenceConstraint bad(c, {0});
  EXPECT_EQ(bad.on_token(2, &error), ConstraintVerdict::kViolated);
  EXPECT_NE(error.find("not allowed"), std::string::npos) << error;
  SequenceConstraint early(c, {0});
  EXPECT_EQ(early.on_token(0, &error), ConstraintVerdict::kViolated);
  EXPECT_NE(error.find("cannot end"), std::string::npos) << error;
}

TEST(StructuredMatcher, RequestFieldsPickOneConstraint) {
  auto vocab = std::make_shared<const TokenVocabulary>(tricky_tokens());
  std::shared_ptr<const TokenConstraint> c, again;
  std::string param, message;
  ASSERT_TRUE(parse_request_constraint(json::parse(R"({"guided_choice": ["yes", "no"]})"), vocab, &c, &param, &message))
      << message;
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->matches("no"));
  ASSERT_TRUE(parse_request_constraint(json::parse(R"({"guided_choice": ["yes", "no"]})"), vocab, &again, &param, &message));
  EXPECT_EQ(c, again) << "the compiled grammar is cached";
  ASSERT_TRUE(parse_request_constraint(json::parse(R"({"response_format": {"type": "text"}})"), vocab, &c, &param, &message));
  EXPECT_EQ(c, nullptr);
  ASSERT_TRUE(parse_request_constraint(
      json::parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
                     "schema": {"type": "integer"}}}})"),
      vocab, &c, &param, &message))
      << message;
  EXPECT_TRUE(c->matches("-12"));
  ASSERT_TRUE(parse_request_constraint(json::parse(R"({"guided_json": "{\"type\": \"boolean\"}"})"), vocab, &c, &param, &message));
  EXPECT_TRUE(c->matches("true"));

  auto refused = [&](const char* body, const char* want_param, const char* want_text) {
    std::shared_ptr<const TokenConstraint> x;
    EXPECT_FALSE(parse_request_constraint(json::parse(body), vocab, &x, &param, &message)) << body;
    EXPECT_EQ(param, want_param) << body;
    EXPECT_NE(message.find(want_text), std::string::npos) << message;
  };
  refused(R"({"guided_regex": "a", "guided_choice": ["a"]})", "guided_choice", "send only one");
  refused(R"({"response_format": {"type": "xml"}})", "response_format", "'xml'");
  refused(R"({"response_format": {"type": "json_schema"}})", "response_format.json_schema", "must be an object");
  refused(R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "bogus": 1}}})",
          "response_format.json_schema.bogus", "unknown field");
  refused(R"({"guided_json": {"type": "array", "contains": {}}})", "guided_json", "unsupported keyword 'contains'");
  refused(R"({"guided_regex": "a(b"})", "guided_regex", "missing ')'");
  refused(R"({"guided_grammar": "root ::= x"})", "guided_grammar", "never defined");
  refused(R"({"guided_json": "{not json"})", "guided_json", "not valid JSON");
  std::shared_ptr<const TokenConstraint> x;
  EXPECT_FALSE(parse_request_constraint(json::parse(R"({"guided_regex": "a"})"), nullptr, &x, &param, &message));
  EXPECT_NE(message.find("tokenizer"), std::string::npos) << message;
}

}  // namespace
}  // namespace tessera::structured
