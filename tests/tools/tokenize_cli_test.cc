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

// --chat-file renders a conversation as the server does and encodes it: the chat-template
// corpus's reference renderings (fixtures/chat_templates: Llama 2's template, system + user;
// Qwen 2.5's with tools, a tool call and its result), with --chat-template naming the file.
TEST_F(TokenizeCliTest, ChatFileRendersAsTheReferenceAndEncodesThePrompt) {
  const std::string corpus = testing::fixtures_dir() + "/chat_templates";
  const nlohmann::ordered_json conversations = nlohmann::ordered_json::parse(testing::read_file(corpus + "/conversations.json"));
  for (const auto& [template_id, conversation_id] : std::vector<std::pair<std::string, std::string>>{
           {"llama2-chat", "b_system_user"}, {"qwen2.5-7b-instruct", "f_tools"}}) {
    SCOPED_TRACE(template_id);
    const nlohmann::json t = nlohmann::json::parse(testing::read_file(corpus + "/templates/" + template_id + ".json"));
    testing::write_file(tmp_ + "/template.jinja", t["template"].get<std::string>());
    nlohmann::ordered_json chat;
    for (const auto& c : conversations)
      if (c["id"] == conversation_id) chat = {{"messages", c["messages"]}, {"tools", c.value("tools", nlohmann::ordered_json())}};
    testing::write_file(tmp_ + "/chat.json", chat.dump());
    auto r = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " --chat-file " +
                                  testing::shell_quote(tmp_ + "/chat.json") + " --chat-template " +
                                  testing::shell_quote(tmp_ + "/template.jinja"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json out = nlohmann::json::parse(r.out);
    const std::string want = testing::read_file(corpus + "/expected/" + template_id + "__" + conversation_id + ".txt");
    EXPECT_EQ(out["prompt"], want);
    testing::write_file(tmp_ + "/prompt", want);
    auto ids = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " --text-file " +
                                    testing::shell_quote(tmp_ + "/prompt"));
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    EXPECT_EQ(out["ids"], nlohmann::json::parse(ids.out)["ids"]);
  }
  // Refusals: one line each, naming what is wrong.
  testing::write_file(tmp_ + "/extra.json", R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 0})");
  testing::write_file(tmp_ + "/role.json", R"({"messages": [{"role": "robot", "content": "hi"}]})");
  testing::write_file(tmp_ + "/broken.jinja", "{% if %}");
  testing::write_file(tmp_ + "/ok.json", R"({"messages": [{"role": "user", "content": "hi"}]})");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--chat-file " + tmp_ + "/extra.json", "unknown field 'temperature'"},
           {"--chat-file " + tmp_ + "/role.json", "messages[0].role"},
           {"--chat-file " + tmp_ + "/none.json", "none.json"},
           {"--chat-file " + tmp_ + "/ok.json --chat-template " + tmp_ + "/broken.jinja", "broken.jinja"},
           {"--chat-template chatml --text hi", "--chat-template requires --chat-file"}}) {
    auto bad = testing::run_command(tokenize_bin() + " --tokenizer " + testing::shell_quote(dir_) + " " + args);
    EXPECT_EQ(bad.exit_code, 1) << args;
    EXPECT_NE(bad.err.find(want), std::string::npos) << args << ": " << bad.err;
  }
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
