// /v1/embeddings over real HTTP against a reference that shares no code with Tessera's forward
// pass: the fixtures' goldens hold PyTorch's logits at every position of a 24-token sequence
// (the case with a 1-token prompt: then 23 greedy tokens, one logits row after each), and the logits
// are the LM head W times the final (normed) hidden state h, so h is W's least-squares solution
// of W h = logits (W has full column rank: vocab > hidden). Pooling those h as the server was
// told (last, mean, CLS) and normalising gives the reference embedding.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/safetensors.h"
#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

constexpr int kPositions = 24;  // positions of the reference sequence, each with its logits

// The reference: PyTorch's final hidden state at each position of the case-0 sequence.
struct ReferenceStates {
  std::vector<int32_t> tokens;            // the 24-token sequence
  std::vector<std::vector<double>> h;     // [position][hidden]
};

// Solves (W^T W) h = W^T l by Cholesky, in double, for every logits row l.
ReferenceStates reference_states(const std::string& model_dir) {
  ReferenceStates out;
  std::ifstream index_file(model_dir + "/goldens/index.json");
  const json index = json::parse(index_file);
  // The case whose prompt is one token: its logits rows then cover every position.
  json c;
  for (const json& k : index["cases"])
    if (k["prompt_ids"].size() == 1 && k["greedy_ids"].size() >= kPositions) c = k;
  EXPECT_FALSE(c.is_null()) << model_dir << " has no golden case with a 1-token prompt";
  for (const auto& t : c["prompt_ids"]) out.tokens.push_back(t.get<int32_t>());
  for (int i = 0; i + 1 < kPositions; ++i) out.tokens.push_back(c["greedy_ids"][static_cast<size_t>(i)].get<int32_t>());
  const std::vector<float> logits = testing::read_f32_file(model_dir + "/goldens/" + c["logits_file"].get<std::string>());

  auto file = SafetensorsFile::open(model_dir + "/model.safetensors");
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  const TensorInfo* w = file.value()->find("lm_head.weight");
  if (w == nullptr) w = file.value()->find("model.embed_tokens.weight");  // tied
  EXPECT_TRUE(w != nullptr && w->stored_dtype == "F32");
  const int64_t vocab = w->shape[0], hidden = w->shape[1];
  EXPECT_GE(static_cast<int64_t>(logits.size()), kPositions * vocab);
  const auto* W = static_cast<const float*>(w->data);

  // A = W^T W (hidden x hidden), then its Cholesky factor L (A = L L^T).
  std::vector<double> A(static_cast<size_t>(hidden * hidden), 0.0);
  for (int64_t v = 0; v < vocab; ++v)
    for (int64_t i = 0; i < hidden; ++i)
      for (int64_t j = 0; j <= i; ++j) A[i * hidden + j] += double{W[v * hidden + i]} * W[v * hidden + j];
  for (int64_t j = 0; j < hidden; ++j) {
    double d = A[j * hidden + j];
    for (int64_t k = 0; k < j; ++k) d -= A[j * hidden + k] * A[j * hidden + k];
    EXPECT_GT(d, 0.0) << "W^T W is not positive definite";
    A[j * hidden + j] = std::sqrt(d);
    for (int64_t i = j + 1; i < hidden; ++i) {
      double s = A[i * hidden + j];
      for (int64_t k = 0; k < j; ++k) s -= A[i * hidden + k] * A[j * hidden + k];
      A[i * hidden + j] = s / A[j * hidden + j];
    }
  }
  for (int p = 0; p < kPositions; ++p) {
    std::vector<double> b(static_cast<size_t>(hidden), 0.0);
    for (int64_t v = 0; v < vocab; ++v)
      for (int64_t i = 0; i < hidden; ++i) b[i] += double{W[v * hidden + i]} * logits[p * vocab + v];
    for (int64_t i = 0; i < hidden; ++i) {  // L y = b
      for (int64_t k = 0; k < i; ++k) b[i] -= A[i * hidden + k] * b[k];
      b[i] /= A[i * hidden + i];
    }
    for (int64_t i = hidden - 1; i >= 0; --i) {  // L^T h = y
      for (int64_t k = i + 1; k < hidden; ++k) b[i] -= A[k * hidden + i] * b[k];
      b[i] /= A[i * hidden + i];
    }
    out.h.push_back(std::move(b));
  }
  return out;
}

// The reference embedding of the sequence's first `length` tokens.
std::vector<double> reference_embedding(const ReferenceStates& ref, const std::string& pooling, int length,
                                        bool normalize = true) {
  std::vector<double> e(ref.h[0].size(), 0.0);
  if (pooling == "last") e = ref.h[static_cast<size_t>(length - 1)];
  if (pooling == "cls") e = ref.h[0];
  if (pooling == "mean") {
    for (int p = 0; p < length; ++p)
      for (size_t i = 0; i < e.size(); ++i) e[i] += ref.h[static_cast<size_t>(p)][i] / length;
  }
  if (!normalize) return e;
  double norm = 0;
  for (double x : e) norm += x * x;
  for (double& x : e) x /= std::sqrt(norm);
  return e;
}

// Cosine and max abs difference of `got` against `want`.
void expect_close(const json& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_TRUE(got.is_array()) << what << ": " << got.dump();
  ASSERT_EQ(got.size(), want.size()) << what;
  double dot = 0, gg = 0, ww = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i].get<double>();
    dot += g * want[i];
    gg += g * g;
    ww += want[i] * want[i];
    max_diff = std::max(max_diff, std::abs(g - want[i]));
  }
  const double cosine = dot / std::sqrt(gg * ww);
  EXPECT_GE(cosine, 0.99999) << what;
  EXPECT_LE(max_diff, 1e-4) << what;
  std::cout << "[ REPORT   ] " << what << ": cosine " << cosine << ", max abs difference " << max_diff << std::endl;
}

json embed(int port, const json& body) {
  const std::string r = testing::http(port, "POST", "/v1/embeddings", body.dump());
  EXPECT_EQ(testing::http_status(r), 200) << r;
  return json::parse(testing::http_body(r), nullptr, false);
}

json ids_of(const ReferenceStates& ref, int length) {
  return json(std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + length));
}

TEST(ServeEmbeddings, EachPoolingMatchesTheReferenceHiddenStatesOfEveryModel) {
  TESSERA_REQUIRE_FIXTURES();
  for (const std::string model : {"tiny-qwen3", "tiny-llama", "kjv-llama"}) {
    const std::string dir = testing::fixtures_dir() + "/" + model;
    const ReferenceStates ref = reference_states(dir);
    for (const std::string pooling : {"last", "mean", "cls"}) {
      SCOPED_TRACE(model + " " + pooling);
      testing::ServeProcess server;
      ASSERT_TRUE(server.start({"--model", dir, "--dtype", "float32", "--set", "model.pooling=" + pooling, "--set",
                                "cache.num_blocks=64"}))
          << server.log();
      // A batch of two inputs of different lengths, and the second again alone.
      const json both = embed(server.port(), {{"input", json::array({ids_of(ref, kPositions), ids_of(ref, 9)})}});
      ASSERT_EQ(both["data"].size(), 2u) << both.dump();
      expect_close(both["data"][0]["embedding"], reference_embedding(ref, pooling, kPositions), model + " " + pooling + " 24 tokens");
      expect_close(both["data"][1]["embedding"], reference_embedding(ref, pooling, 9), model + " " + pooling + " 9 tokens");
      EXPECT_EQ(both["usage"]["prompt_tokens"], kPositions + 9);
      const json alone = embed(server.port(), {{"input", ids_of(ref, 9)}});
      expect_close(alone["data"][0]["embedding"], reference_embedding(ref, pooling, 9), model + " " + pooling + " alone");
    }
  }
}

// Two ranks, prompts computed in chunks of 8 tokens, and a long greedy completion running in
// the same steps: the embeddings still match, and the completion still gives the goldens' ids.
TEST(ServeEmbeddings, TensorParallelChunkedAndBatchedWithGeneration) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/kjv-llama";
  const ReferenceStates ref = reference_states(dir);
  std::ifstream index_file(dir + "/goldens/index.json");
  const json golden = json::parse(index_file)["cases"][1];
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", dir, "--dtype", "float32", "--set", "model.pooling=mean", "--set",
                            "parallel.tensor_parallel=2", "--set", "scheduler.max_num_batched_tokens=8", "--set",
                            "scheduler.max_num_seqs=4", "--set",
                            "cache.num_blocks=128"}))
      << server.log();
  std::string completion;
  std::thread generating([&] {
    const json body = {{"prompt", golden["prompt_ids"]},
                       {"max_tokens", golden["greedy_ids"].size()},
                       {"temperature", 0},
                       {"ignore_eos", true}};
    completion = testing::http(server.port(), "POST", "/v1/completions", body.dump());
  });
  for (int round = 0; round < 4; ++round) {
    const json r = embed(server.port(), {{"input", json::array({ids_of(ref, kPositions), ids_of(ref, 13)})}});
    ASSERT_EQ(r["data"].size(), 2u) << r.dump();
    expect_close(r["data"][0]["embedding"], reference_embedding(ref, "mean", kPositions), "TP 2 mean 24 tokens");
    expect_close(r["data"][1]["embedding"], reference_embedding(ref, "mean", 13), "TP 2 mean 13 tokens");
  }
  generating.join();
  ASSERT_EQ(testing::http_status(completion), 200) << completion;
  // The greedy completion is the goldens' continuation: prompt + its text decodes as the
  // goldens' ids after the prompt's.
  auto detokenize = [&](const json& ids) {
    return json::parse(testing::http_body(
        testing::http(server.port(), "POST", "/detokenize", json{{"tokens", ids}}.dump())))["prompt"].get<std::string>();
  };
  json all_ids = golden["prompt_ids"];
  for (const auto& t : golden["greedy_ids"]) all_ids.push_back(t);
  EXPECT_EQ(detokenize(golden["prompt_ids"]) + json::parse(testing::http_body(completion))["choices"][0]["text"].get<std::string>(),
            detokenize(all_ids));
  // Prometheus counts the embeddings' inputs as prompt tokens.
  EXPECT_NE(testing::http(server.port(), "GET", "/metrics").find("vllm:prompt_tokens_total"), std::string::npos);
}

TEST(ServeEmbeddings, FormatsDimensionsTruncationAndRefusals) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/kjv-llama";
  const ReferenceStates ref = reference_states(dir);
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", dir, "--dtype", "float32", "--set", "model.normalize=false", "--set",
                            "cache.num_blocks=64", "--set", "scheduler.max_model_len=32"}))
      << server.log();
  const int port = server.port();
  // Not normalised: the raw last hidden state.
  const json raw = embed(port, {{"input", ids_of(ref, 10)}});
  expect_close(raw["data"][0]["embedding"], reference_embedding(ref, "last", 10, false), "last, not normalised");
  // dimensions: the first values, as they are (normalisation is off).
  const json cut = embed(port, {{"input", ids_of(ref, 10)}, {"dimensions", 7}});
  ASSERT_EQ(cut["data"][0]["embedding"].size(), 7u);
  for (size_t i = 0; i < 7; ++i)
    EXPECT_EQ(cut["data"][0]["embedding"][i], raw["data"][0]["embedding"][i]);
  // base64: the same float32 values, little-endian.
  const json b64 = embed(port, {{"input", ids_of(ref, 10)}, {"encoding_format", "base64"}, {"dimensions", 3}});
  const std::string text = b64["data"][0]["embedding"].get<std::string>();
  ASSERT_EQ(text.size(), 16u);  // 12 bytes
  auto sextet = [](char ch) -> uint32_t {
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    return static_cast<uint32_t>(alphabet.find(ch));
  };
  std::string bytes;
  for (size_t i = 0; i < text.size(); i += 4) {
    const uint32_t v = sextet(text[i]) << 18 | sextet(text[i + 1]) << 12 | sextet(text[i + 2]) << 6 | sextet(text[i + 3]);
    bytes += static_cast<char>(v >> 16);
    bytes += static_cast<char>(v >> 8);
    bytes += static_cast<char>(v);
  }
  float values[3];
  std::memcpy(values, bytes.data(), sizeof(values));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(values[i], raw["data"][0]["embedding"][i].get<float>());
  // Text input is tokenized as the model expects (BOS first): the same as its ids.
  const json tok = json::parse(testing::http_body(testing::http(port, "POST", "/tokenize", json{{"prompt", "In the beginning"}}.dump())));
  const json by_text = embed(port, {{"input", "In the beginning"}});
  const json by_ids = embed(port, {{"input", tok["tokens"]}});
  EXPECT_EQ(by_text["data"][0]["embedding"], by_ids["data"][0]["embedding"]);
  EXPECT_EQ(by_text["usage"]["prompt_tokens"], tok["tokens"].size());
  // Over max_model_len: a 400 naming the limit, or the last tokens kept when asked.
  const json long_ids = ids_of(ref, kPositions);
  json too_long = json::array();
  for (int k = 0; k < 2; ++k)
    for (const auto& t : long_ids) too_long.push_back(t);
  const std::string refused = testing::http(port, "POST", "/v1/embeddings", json{{"input", too_long}}.dump());
  EXPECT_EQ(testing::http_status(refused), 400) << refused;
  EXPECT_NE(refused.find("max_model_len 32"), std::string::npos) << refused;
  const json kept = embed(port, {{"input", too_long}, {"truncate_prompt_tokens", 24}});
  EXPECT_EQ(kept["usage"]["prompt_tokens"], 24);
  // Bad fields are 400s naming them.
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"input", "x"}, {"encoding_format", "int8"}}, "encoding_format"},
           {{{"input", "x"}, {"dimensions", 0}}, "dimensions"},
           {{{"input", "x"}, {"dimensions", 100000}}, "dimensions"},
           {{{"input", "x"}, {"truncate_prompt_tokens", 0}}, "truncate_prompt_tokens"},
           {{{"input", json::array()}}, "input"},
           {{{"input", json::array({1, -2})}}, "input"},
           {{{"input", "x"}, {"stream", true}}, "stream"},
           {{{"prompt", "x"}}, "prompt"},
           {json::object(), "input"}}) {
    const std::string r = testing::http(port, "POST", "/v1/embeddings", body.dump());
    EXPECT_EQ(testing::http_status(r), 400) << body.dump() << "\n" << r;
    const json e = json::parse(testing::http_body(r), nullptr, false);
    EXPECT_EQ(e["error"]["param"], param) << body.dump() << "\n" << r;
  }
  const std::string wrong_model =
      testing::http(port, "POST", "/v1/embeddings", json{{"input", "x"}, {"model", "other"}}.dump());
  EXPECT_EQ(testing::http_status(wrong_model), 404) << wrong_model;
}

TEST(ServeEmbeddings, TaskSettingDecidesTheEndpointsAndSentenceTransformerFilesThePooling) {
  TESSERA_REQUIRE_FIXTURES();
  {
    testing::ServeProcess server;
    ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--set", "server.task=generate",
                              "--set", "cache.num_blocks=64"}))
        << server.log();
    const std::string r = testing::http(server.port(), "POST", "/v1/embeddings", R"({"input":[1,2,3]})");
    EXPECT_EQ(testing::http_status(r), 400) << r;
    EXPECT_NE(r.find("server.task"), std::string::npos) << r;
  }
  {
    testing::ServeProcess server;
    ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--set", "server.task=embed",
                              "--set", "cache.num_blocks=64"}))
        << server.log();
    const std::string r = testing::http(server.port(), "POST", "/v1/completions", R"({"prompt":[1,2,3]})");
    EXPECT_EQ(testing::http_status(r), 400) << r;
    EXPECT_NE(r.find("server.task"), std::string::npos) << r;
    const std::string e = testing::http(server.port(), "POST", "/v1/embeddings", R"({"input":[1,2,3]})");
    EXPECT_EQ(testing::http_status(e), 200) << e;
    EXPECT_NE(server.log().find("no LM head: server.task is embed"), std::string::npos) << server.log();
  }
  {
    // Speculative decoding on a server that never generates: refused by name.
    testing::ServeProcess server;
    EXPECT_FALSE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--set", "server.task=embed",
                               "--set", "speculative.method=ngram"}));
    EXPECT_NE(server.log().find("speculative.method"), std::string::npos) << server.log();
  }
  // A sentence-transformers folder: its Pooling config and Normalize module decide.
  const std::string folder = testing::make_temp_dir("tessera-st-model");
  const std::string src = testing::fixtures_dir() + "/tiny-llama";
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::create_symlink(src + "/" + f, folder + "/" + f);
  std::filesystem::create_directories(folder + "/1_Pooling");
  std::ofstream(folder + "/modules.json")
      << R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},)"
      << R"({"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}])";
  std::ofstream(folder + "/1_Pooling/config.json")
      << R"({"word_embedding_dimension":192,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true,)"
      << R"("pooling_mode_max_tokens":false,"pooling_mode_lasttoken":false,"include_prompt":true})";
  {
    testing::ServeProcess server;
    ASSERT_TRUE(server.start({"--model", folder, "--set", "cache.num_blocks=64"})) << server.log();
    EXPECT_NE(server.log().find("embeddings (server.task both): mean pooling"), std::string::npos) << server.log();
    EXPECT_NE(server.log().find("not normalised (modules.json has no Normalize module)"), std::string::npos)
        << server.log();
  }
  // Max pooling is not computed: start-up stops naming the file and the field.
  std::ofstream(folder + "/1_Pooling/config.json")
      << R"({"word_embedding_dimension":192,"pooling_mode_max_tokens":true})";
  {
    testing::ServeProcess server;
    EXPECT_FALSE(server.start({"--model", folder, "--set", "cache.num_blocks=64"}));
    EXPECT_NE(server.log().find("1_Pooling/config.json: pooling_mode_max_tokens"), std::string::npos) << server.log();
  }
  std::filesystem::remove_all(folder);
}

}  // namespace
}  // namespace tessera
