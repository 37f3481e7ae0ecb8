// transformers' clean_up_tokenization (tokenizer_config.json's clean_up_tokenization_spaces):
// the replacements and their order, the streaming form against the whole-text form, and the
// tokenizer honouring (and validating) the flag.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenization_cleanup.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using tok::clean_up_tokenization;
using tok::CleanupStream;

TEST(TokenizationCleanup, RemovesTheSpaceBeforePunctuationAndContractions) {
  EXPECT_EQ(clean_up_tokenization("Hello , world ! Is it ? Yes ."), "Hello, world! Is it? Yes.");
  EXPECT_EQ(clean_up_tokenization("I do n't think I 'm sure it 's what we 've or you 're"),
            "I don't think I'm sure it's what we've or you're");
  EXPECT_EQ(clean_up_tokenization("rock ' n roll"), "rock'n roll");
  // The issue's Llama-3.1 case: the space before "..." goes.
  EXPECT_EQ(clean_up_tokenization("call(a, b) ...);"), "call(a, b)...);");
  // Untouched: no space before, other punctuation, other contractions.
  EXPECT_EQ(clean_up_tokenization("a.b ; c : d 'll e 'd"), "a.b ; c : d 'll e 'd");
}

TEST(TokenizationCleanup, ReplacementsRunInTransformersOrder) {
  // " ' " runs before " 've": its result can make a new " 've".
  EXPECT_EQ(clean_up_tokenization("x  ' ve"), "x've");
  // " ." before " ' ": the first match consumes the space the second would need.
  EXPECT_EQ(clean_up_tokenization("a ' ."), "a '.");
  // str.replace does not rescan its own output: " ,," stays ",," but "  ," keeps one space.
  EXPECT_EQ(clean_up_tokenization("a  ,"), "a ,");
}

std::string random_cleanup_text(std::mt19937& rng, size_t n) {
  static const std::string alphabet = " 'ntvesmr.x,?!";
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += alphabet[pick(rng)];
  return s;
}

TEST(TokenizationCleanup, StreamedPiecesConcatenateToTheWholeCleanUp) {
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::string text = random_cleanup_text(rng, 1 + i % 24);
    CleanupStream stream;
    std::string out;
    size_t at = 0;
    while (at < text.size()) {
      const size_t len = std::uniform_int_distribution<size_t>(0, 4)(rng);
      out += stream.push(std::string_view(text).substr(at, len));
      at += len;
    }
    out += stream.finish();
    ASSERT_EQ(out, clean_up_tokenization(text)) << "text '" << text << "'";
  }
}

TEST(TokenizationCleanup, StreamHoldsBackOnlyWhatCouldStillChange) {
  CleanupStream stream;
  EXPECT_EQ(stream.push("Hello wor"), "Hello wor");  // " wor" cannot become a replacement
  EXPECT_EQ(stream.push("ld n"), "ld");              // " n" could be " n't"
  EXPECT_EQ(stream.push("'t"), "n't");               // and was: its space goes
  EXPECT_EQ(stream.finish(), "");
}

std::unique_ptr<Tokenizer> gpt2() {
  auto tok = Tokenizer::load(testing::fixtures_dir() + "/tokenizers/gpt2");
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return tok.is_ok() ? std::move(tok).value() : nullptr;
}

TEST(TokenizationCleanup, Gpt2ConfigTurnsItOnForDecodeAndStreaming) {
  TESSERA_REQUIRE_FIXTURES();
  auto tok = gpt2();
  ASSERT_NE(tok, nullptr);
  ASSERT_TRUE(tok->cleans_up_tokenization_spaces());
  const std::string text = "Hello , world ! I do n't know .";
  const auto ids = tok->encode(text, false);
  EXPECT_EQ(tok->decode_without_cleanup(ids, false), text);
  EXPECT_EQ(tok->decode(ids, false), "Hello, world! I don't know.");
  IncrementalDetokenizer stream(*tok, false);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  EXPECT_EQ(streamed, "Hello, world! I don't know.");
}

TEST(TokenizationCleanup, ANonBooleanFlagIsRefusedNamingIt) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string tokenizer_json = testing::read_file(testing::fixtures_dir() + "/tokenizers/gpt2/tokenizer.json");
  auto bad = Tokenizer::from_json(tokenizer_json, R"({"clean_up_tokenization_spaces": "yes"})");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("clean_up_tokenization_spaces: expected true or false"), std::string::npos)
      << bad.status().to_string();
  auto off = Tokenizer::from_json(tokenizer_json, R"({"clean_up_tokenization_spaces": false})");
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  EXPECT_EQ(off.value()->decode(off.value()->encode("a , b", false), false), "a , b");
}

}  // namespace
}  // namespace tessera
