// Pieces of the pipeline checked against behaviour documented by tokenizers and the
// Unicode standard (not against this implementation's own output).
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode_utils.h"
#include "tests/test_support.h"

namespace tessera::tok {
namespace {

std::vector<std::string> split_texts(const std::string& text, const std::string& delim, SplitBehavior b) {
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t p = text.find(delim); p != std::string::npos; p = text.find(delim, p + delim.size())) {
    matches.emplace_back(p, p + delim.size());
  }
  std::vector<Piece> out;
  split_piece(Piece{text, true}, matches, b, false, out);
  std::vector<std::string> texts;
  for (const auto& p : out) texts.push_back(p.text);
  return texts;
}

// The examples of tokenizers' SplitDelimiterBehavior documentation ("the-final--countdown", "-").
TEST(TokenizerComponents, SplitBehaviorsMatchTokenizersDocs) {
  const std::string s = "the-final--countdown";
  using V = std::vector<std::string>;
  EXPECT_EQ(split_texts(s, "-", SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split_texts(s, "-", SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split_texts(s, "-", SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split_texts(s, "-", SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split_texts(s, "-", SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
}

TEST(TokenizerComponents, Gpt2PatternUsesUnicodeClasses) {
  auto re = Regex::compile(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  ASSERT_TRUE(re.is_ok()) << re.status().to_string();
  std::vector<std::pair<size_t, size_t>> m;
  const std::string text = "Héllo  wörld's 123\xE4\xB8\xAD!";
  re.value()->find_all(text, m);
  std::vector<std::string> parts;
  for (auto [s, e] : m) parts.push_back(text.substr(s, e - s));
  EXPECT_EQ(parts, (std::vector<std::string>{"Héllo", " ", " wörld", "'s", " 123", "\xE4\xB8\xAD", "!"}));
}

TEST(TokenizerComponents, OnigurumaNestedClassIsFlattened) {
  // BLOOM's pre-tokenizer pattern uses a class nested inside a negated class.
  auto t = translate_oniguruma_pattern(R"( ?[^(\s|[.,!?…。，、।۔،])]+)");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto re = Regex::compile(R"( ?[^(\s|[.,!?…。，、।۔،])]+)");
  ASSERT_TRUE(re.is_ok()) << re.status().to_string();
  std::vector<std::pair<size_t, size_t>> m;
  const std::string text = "Hello, world. ok";
  re.value()->find_all(text, m);
  std::vector<std::string> parts;
  for (auto [s, e] : m) parts.push_back(text.substr(s, e - s));
  EXPECT_EQ(parts, (std::vector<std::string>{"Hello", " world", " ok"}));
}

TEST(TokenizerComponents, ByteLevelTableIsGpt2s) {
  const auto& chars = byte_level_chars();
  EXPECT_EQ(chars[' '], "\xC4\xA0");   // 'Ġ' (U+0120)
  EXPECT_EQ(chars['\n'], "\xC4\x8A");  // 'Ċ' (U+010A)
  EXPECT_EQ(chars['A'], "A");
  EXPECT_EQ(chars[0xAD], "\xC5\x83");  // soft hyphen -> U+0143
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    EXPECT_EQ(byte_level_byte(next_code_point(chars[b], i)), b);
  }
}

TEST(TokenizerComponents, NfcComposes) {
  auto nfc = normalize_unicode("e\xCC\x81", NormalizationForm::kNfc);
  ASSERT_TRUE(nfc.is_ok());
  EXPECT_EQ(nfc.value(), "\xC3\xA9");
  auto nfkc = normalize_unicode("\xEF\xAC\x81", NormalizationForm::kNfkc);  // "ﬁ" ligature
  ASSERT_TRUE(nfkc.is_ok());
  EXPECT_EQ(nfkc.value(), "fi");
}

}  // namespace
}  // namespace tessera::tok
