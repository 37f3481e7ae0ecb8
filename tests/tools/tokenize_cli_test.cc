// tessera-tokenize as a user runs it, against the kjv-llama tokenizer vectors (ids made by
// Hugging Face tokenizers).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

std::string tokenize_bin() { return testing::bin_dir() + "/tessera-tokenize"; }

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    dir_ = testing::fixtures_dir() + "/kjv-llama";
    std::ifstream in(dir_ + "/tokenizer_vectors.json");
    vectors_ = nlohmann::json::parse(in);
    tmp_ = testing::make_temp_dir("tessera-tok-cli");
  }
  void TearDown() override {
    if (!tmp_.empty()) std::filesystem::remove_all(tmp_);
  }
  std::string dir_, tmp_;
  nlohmann::json vectors_;
};

TEST_F(TokenizeCliTest, TextFileBytesEncodeExactlyLikeHuggingFace) {
  ASSERT_GT(vectors_.size(), 20u);
  // Through a file, so whitespace, newlines and non-ASCII reach the program unchanged.
  for (size_t i = 0; i < 20; ++i) {
    const auto& v = vectors_[i * vectors_.size() / 20];
    const std::string path = tmp_ + "/text";
    testing::write_file(path, v["text"].get<std::string>());
    auto r = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " --text-file " + testing::shell_quote(path) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], v["ids"]) << v["text"];
  }
}

// A GGUF file's own vocabulary, as the servers read it: the same ids for every vector.
TEST_F(TokenizeCliTest, GgufFileEncodesWithItsOwnVocabulary) {
  const std::string gguf = testing::fixtures_dir() + "/gguf/kjv-llama-Q8_0.gguf";
  if (!std::filesystem::exists(gguf)) GTEST_SKIP() << "SKIPPED: no " << gguf;
  for (size_t i = 0; i < 10; ++i) {
    const auto& v = vectors_[i * vectors_.size() / 10];
    const std::string path = tmp_ + "/text";
    testing::write_file(path, v["text"].get<std::string>());
    auto r = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(gguf) + " --text-file " +
                                  testing::shell_quote(path) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], v["ids"]) << v["text"];
  }
  auto missing = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(tmp_ + "/none.gguf") +
                                      " --text x --json");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("none.gguf"), std::string::npos) << missing.err;
}

TEST_F(TokenizeCliTest, SpecialTokensOnlyWhenAskedAndDecodeRoundTrips) {
  auto plain = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " --text 'In the beginning' --json");
  auto with_bos = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) +
                                       " --text 'In the beginning' --json --add-special-tokens");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(with_bos.exit_code, 0) << with_bos.err;
  auto ids = nlohmann::json::parse(plain.out)["ids"];
  auto bos_ids = nlohmann::json::parse(with_bos.out)["ids"];
  ASSERT_EQ(bos_ids.size(), ids.size() + 1);
  EXPECT_EQ(bos_ids[0], 1);  // <s>
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
  auto dec = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " --decode " + list);
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(nlohmann::json::parse(dec.out)["text"], "In the beginning");
}

TEST_F(TokenizeCliTest, BadInputsGiveOneLineAndNonZeroExit) {
  auto missing = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(tmp_ + "/nowhere") + " --text hi");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nowhere"), std::string::npos) << missing.err;
  auto bad_id = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " --decode 1,99999");
  EXPECT_NE(bad_id.exit_code, 0);
  EXPECT_NE(bad_id.err.find("99999"), std::string::npos) << bad_id.err;
  EXPECT_LT(bad_id.exit_code, 128);
}

// GPT-2's tokenizer_config.json sets clean_up_tokenization_spaces: --decode gives what
// transformers' decode gives, --no-cleanup what the tokenizers library gives.
TEST_F(TokenizeCliTest, DecodeCleansUpSpacesAsTheConfigSaysUnlessNoCleanup) {
  const std::string gpt2 = testing::shell_quote(testing::fixtures_dir() + "/tokenizers/gpt2");
  auto enc = testing::run_command(tokenize_bin() + " --tokenizer " + gpt2 + " --text \"Hello , world ! I 'm\"");
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  std::string list;
  const nlohmann::json ids = nlohmann::json::parse(enc.out)["ids"];
  for (const auto& id : ids) {
    list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
  }
  auto cleaned = testing::run_command(tokenize_bin() + " --tokenizer " + gpt2 + " --decode " + list);
  auto raw = testing::run_command(tokenize_bin() + " --tokenizer " + gpt2 + " --decode " + list + " --no-cleanup");
  ASSERT_EQ(cleaned.exit_code, 0) << cleaned.err;
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  EXPECT_EQ(nlohmann::json::parse(cleaned.out)["text"], "Hello, world! I'm");
  EXPECT_EQ(nlohmann::json::parse(raw.out)["text"], "Hello , world ! I 'm");
}

}  // namespace
}  // namespace tessera
