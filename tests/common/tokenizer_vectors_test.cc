// Every reference vector in ../shared/fixtures (made by Hugging Face tokenizers and
// cross-checked by llama.cpp and transformers.js) must match exactly, encode and decode.
#include <nlohmann/json.hpp>

#include <sstream>

#include "common/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using testing::fixtures_dir;
using testing::read_file;

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's .inp/.out pair: strings separated by "\n__ggml_vocab_test__\n", one line
// of space-separated ids per string.
std::vector<Vector> read_ggml_vectors(const std::string& stem) {
  const std::string inp = read_file(stem + ".inp");
  const std::string out = read_file(stem + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t next = inp.find(sep); next != std::string::npos; next = inp.find(sep, pos)) {
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<Vector> vectors;
  std::istringstream lines(out);
  std::string line;
  for (const auto& t : texts) {
    std::getline(lines, line);
    Vector v{t, {}};
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) v.ids.push_back(id);
    vectors.push_back(v);
  }
  return vectors;
}

std::unique_ptr<Tokenizer> load_or_die(const std::string& dir) {
  auto tok = Tokenizer::load(dir);
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return tok.is_ok() ? std::move(tok).value() : nullptr;
}

void check_ggml_vectors(const std::string& tokenizer, const std::string& vocab_file) {
  auto tok = load_or_die(fixtures_dir() + "/tokenizers/" + tokenizer);
  ASSERT_NE(tok, nullptr);
  const auto vectors = read_ggml_vectors(fixtures_dir() + "/tokenizers/vectors/" + vocab_file);
  ASSERT_EQ(vectors.size(), 46u);
  int matched = 0;
  for (const auto& v : vectors) {
    EXPECT_EQ(tok->encode(v.text, false), v.ids) << "text: '" << v.text << "'";
    // llama.cpp's vectors follow the tokenizers library: no transformers clean-up.
    EXPECT_EQ(tok->decode_without_cleanup(v.ids, false), v.text) << "ids of '" << v.text << "'";
    matched += tok->encode(v.text, false) == v.ids;
  }
  EXPECT_EQ(matched, 46);
}

TEST(TokenizerVectors, Gpt2ByteLevel) {
  TESSERA_REQUIRE_FIXTURES();
  check_ggml_vectors("gpt2", "ggml-vocab-gpt-2.gguf");
}

TEST(TokenizerVectors, Llama2SentencePieceLayout) {
  TESSERA_REQUIRE_FIXTURES();
  check_ggml_vectors("llama2-spm", "ggml-vocab-llama-spm.gguf");
}

TEST(TokenizerVectors, KjvLlamaMetaspace) {
  TESSERA_REQUIRE_FIXTURES();
  auto tok = load_or_die(fixtures_dir() + "/kjv-llama");
  ASSERT_NE(tok, nullptr);
  const auto j = nlohmann::json::parse(read_file(fixtures_dir() + "/kjv-llama/tokenizer_vectors.json"));
  ASSERT_EQ(j.size(), 200u);
  int encoded = 0, decoded = 0;
  for (const auto& v : j) {
    const std::string text = v["text"].get<std::string>();
    const auto ids = v["ids"].get<std::vector<int32_t>>();
    const auto got = tok->encode(text, false);
    EXPECT_EQ(got, ids) << "text: '" << text << "'";
    encoded += got == ids;
    // `decoded` is the decode of SentencePiece's ids (equal to `ids` except for texts
    // that begin with a space, where SentencePiece adds one more "▁").
    const std::string want = v["decoded"].get<std::string>();
    const auto spm_ids = v["spm_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->decode(spm_ids, true), want) << "ids of '" << text << "'";
    decoded += tok->decode(spm_ids, true) == want;
    if (spm_ids != ids) {
      // Hugging Face's own round trip loses exactly that one leading space.
      EXPECT_EQ(" " + tok->decode(ids, true), want) << text;
    }
  }
  EXPECT_EQ(encoded, 200);
  EXPECT_EQ(decoded, 200);
}

TEST(TokenizerVectors, KjvLlamaSpecialTokensAndConfig) {
  TESSERA_REQUIRE_FIXTURES();
  auto tok = load_or_die(fixtures_dir() + "/kjv-llama");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->vocab_size(), 1024);
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(500));
  EXPECT_NE(tok->chat_template().find("bos_token"), std::string::npos);
  const auto plain = tok->encode("In the beginning", false);
  auto with_bos = tok->encode("In the beginning", true);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), plain);
  // The goldens' prompt_ids are [1] + ids of prompt_text.
  const auto goldens = nlohmann::json::parse(read_file(fixtures_dir() + "/kjv-llama/goldens/index.json"));
  int checked = 0;
  for (const auto& c : goldens["cases"]) {
    if (!c.contains("prompt_text") || !c["prompt_text"].is_string()) continue;
    const std::string prompt = c["prompt_text"].get<std::string>();
    if (prompt == "<s>") continue;  // the BOS-alone case has no text
    EXPECT_EQ(tok->encode(prompt, true), c["prompt_ids"].get<std::vector<int32_t>>()) << prompt;
    if (c.contains("greedy_text") && c["greedy_text"].is_string()) {
      // greedy_text is the decoded continuation.
      EXPECT_EQ(tok->decode(c["greedy_ids"].get<std::vector<int32_t>>(), true), c["greedy_text"].get<std::string>());
    }
    if (c.contains("full_text") && c["full_text"].is_string()) {
      auto all = c["prompt_ids"].get<std::vector<int32_t>>();
      const auto greedy = c["greedy_ids"].get<std::vector<int32_t>>();
      all.insert(all.end(), greedy.begin(), greedy.end());
      EXPECT_EQ(tok->decode(all, true), c["full_text"].get<std::string>());
    }
    ++checked;
  }
  EXPECT_GE(checked, 5);
  // Special tokens in the text are matched before the model.
  EXPECT_EQ(tok->encode("<s>", false), std::vector<int32_t>{1});
  EXPECT_EQ(tok->decode({1, 2}, false), "<s></s>");
  EXPECT_EQ(tok->decode({1, 2}, true), "");
}

TEST(TokenizerVectors, Gpt2ConfigAndSpecialToken) {
  TESSERA_REQUIRE_FIXTURES();
  auto tok = load_or_die(fixtures_dir() + "/tokenizers/gpt2");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 50256);
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->chat_template(), "");
  // GPT-2's ByteLevel post-processor adds no ids.
  EXPECT_EQ(tok->encode("Hello world", true), tok->encode("Hello world", false));
  const auto ids = tok->encode("a<|endoftext|>b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 50256);
  EXPECT_EQ(tok->decode(ids, true), "ab");
  EXPECT_EQ(tok->decode(ids, false), "a<|endoftext|>b");
}

TEST(TokenizerVectors, Llama2LegacyBosAndSpecialSplit) {
  TESSERA_REQUIRE_FIXTURES();
  auto tok = load_or_die(fixtures_dir() + "/tokenizers/llama2-spm");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  const auto ids = tok->encode("Hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  // The legacy layout normalizes each run between special tokens on its own, so the
  // run after "</s>" gets its own "▁" prefix: "▁Hello" twice.
  const auto hello = tok->encode("Hello", false);
  std::vector<int32_t> want = hello;
  want.push_back(2);
  want.insert(want.end(), hello.begin(), hello.end());
  EXPECT_EQ(tok->encode("Hello</s>Hello", false), want);
}

}  // namespace
}  // namespace tessera
