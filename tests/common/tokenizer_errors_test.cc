// Malformed tokenizer files give a clear Status naming the file and the field.
#include "common/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

// A minimal valid byte-level BPE tokenizer.json; tests break one part of it at a time.
std::string tiny_tokenizer(const std::string& model_type = "\"BPE\"", const std::string& merges = R"([["a", "b"]])",
                           const std::string& normalizer = "null", const std::string& decoder = R"({"type": "ByteLevel"})") {
  return R"({"version": "1.0", "added_tokens": [{"id": 4, "content": "<eos>", "special": true, "normalized": false}],
    "normalizer": )" + normalizer + R"(,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": )" + decoder + R"(,
    "model": {"type": )" + model_type + R"(, "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3}, "merges": )" + merges + "}}";
}

std::string write_dir(const std::string& tokenizer_json, const std::string& config_json = "") {
  const std::string dir = testing::make_temp_dir("tok_err");
  testing::write_file(dir + "/tokenizer.json", tokenizer_json);
  if (!config_json.empty()) testing::write_file(dir + "/tokenizer_config.json", config_json);
  return dir;
}

void expect_error(const std::string& tokenizer_json, const std::vector<std::string>& fragments,
                  const std::string& config_json = "") {
  const std::string dir = write_dir(tokenizer_json, config_json);
  auto tok = Tokenizer::load(dir);
  ASSERT_FALSE(tok.is_ok()) << "expected an error";
  const std::string msg = tok.status().to_string();
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

TEST(TokenizerErrors, TinyTokenizerLoadsAndMerges) {
  auto tok = Tokenizer::load(write_dir(tiny_tokenizer()));
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok.value()->encode("abc", false), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(tok.value()->encode("ab<eos>", false), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(tok.value()->vocab_size(), 5);
}

TEST(TokenizerErrors, MissingDirectoryAndFile) {
  auto tok = Tokenizer::load("/nonexistent/tessera/tokenizer");
  ASSERT_FALSE(tok.is_ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  const std::string empty_dir = testing::make_temp_dir("tok_empty");
  tok = Tokenizer::load(empty_dir);
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrors, BadJson) { expect_error("{\"model\": {", {"tokenizer.json", "invalid JSON"}); }

TEST(TokenizerErrors, BadConfigJson) {
  expect_error(tiny_tokenizer(), {"tokenizer_config.json", "invalid JSON"}, "{not json");
}

TEST(TokenizerErrors, UnknownModelType) {
  expect_error(tiny_tokenizer("\"Unigram\""), {"tokenizer.json", "model.type", "Unigram"});
}

TEST(TokenizerErrors, MergeNamesUnknownToken) {
  expect_error(tiny_tokenizer("\"BPE\"", R"([["a", "b"], ["a", "zz"]])"),
               {"tokenizer.json", "model.merges[1]", "'zz'", "not in model.vocab"});
}

TEST(TokenizerErrors, MergedTokenNotInVocab) {
  expect_error(tiny_tokenizer("\"BPE\"", R"(["b c"])"), {"model.merges[0]", "'bc'"});
}

TEST(TokenizerErrors, MalformedMergeString) {
  expect_error(tiny_tokenizer("\"BPE\"", R"(["abc"])"), {"model.merges[0]", "left right"});
}

TEST(TokenizerErrors, UnsupportedNormalizerNamed) {
  expect_error(tiny_tokenizer("\"BPE\"", "[]", R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "BertNormalizer"}]})"),
               {"normalizer.normalizers[1]", "BertNormalizer"});
}

TEST(TokenizerErrors, UnsupportedDecoderNamed) {
  expect_error(tiny_tokenizer("\"BPE\"", "[]", "null", R"({"type": "WordPiece"})"), {"decoder", "WordPiece"});
}

TEST(TokenizerErrors, BadRegexNamed) {
  std::string j = tiny_tokenizer();
  const std::string from = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
  j.replace(j.find(from), from.size(), R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  expect_error(j, {"pre_tokenizer.pattern", "(unclosed"});
}

TEST(TokenizerErrors, ConfigNamesUnknownBos) {
  expect_error(tiny_tokenizer(), {"tokenizer_config.json", "bos_token", "<nope>"}, R"({"bos_token": "<nope>"})");
}

TEST(TokenizerErrors, WrongFieldType) {
  std::string j = tiny_tokenizer();
  j.replace(j.find("\"vocab\": {"), 10, "\"vocab\": [], \"x\": {");
  expect_error(j, {"model.vocab"});
}

}  // namespace
}  // namespace tessera
