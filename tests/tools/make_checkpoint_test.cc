// Runs the real tessera-make-checkpoint program and reads its output back with Checkpoint.
// Expected tensor names are spelled out here from the Hugging Face layouts, and config keys
// are compared with the reference fixtures' config.json files (written by other tooling).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <cstring>

#include "common/checkpoint.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::run_command;

class MakeCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::make_temp_dir("make_checkpoint_test");
    program_ = ::tessera::testing::bin_dir() + "/tessera-make-checkpoint";
    ASSERT_TRUE(fs::exists(program_)) << program_ << " is not built";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs the program with `args`, writing into dir_/<out>; returns the result.
  ::tessera::testing::CommandResult make(const std::string& out, const std::string& args) {
    return run_command(program_ + " --out " + dir_ + "/" + out + " " + args);
  }
  std::unique_ptr<Checkpoint> open(const std::string& out) {
    auto c = Checkpoint::open(dir_ + "/" + out);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? std::move(c.value()) : nullptr;
  }
  static std::vector<int64_t> shape(const Checkpoint& c, const std::string& name) {
    const TensorInfo* t = c.find(name);
    EXPECT_NE(t, nullptr) << name;
    return t ? t->shape : std::vector<int64_t>{};
  }
  // The keys of a reference fixture's config.json (transformers 4.47 layout).
  static std::set<std::string> fixture_keys(const std::string& model) {
    auto c = Checkpoint::open(::tessera::testing::fixtures_dir() + "/" + model);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    std::set<std::string> keys;
    if (c.is_ok())
      for (const auto& [k, v] : c.value()->config().items()) keys.insert(k);
    return keys;
  }
  static std::set<std::string> keys_of(const nlohmann::json& j) {
    std::set<std::string> keys;
    for (const auto& [k, v] : j.items()) keys.insert(k);
    return keys;
  }

  std::string dir_, program_;
};

std::set<std::string> names_of(const Checkpoint& c) {
  auto v = c.tensor_names();
  return {v.begin(), v.end()};
}

TEST_F(MakeCheckpointTest, LlamaNamesShapesAndConfig) {
  auto r = make("llama", "--arch llama --hidden 48 --layers 3 --heads 6 --kv-heads 2 --ffn 80 --vocab 100 "
                         "--max-positions 256 --rope-theta 500000 --seed 7");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("parameters"), std::string::npos) << "summary line on stderr: " << r.err;
  auto c = open("llama");
  ASSERT_NE(c, nullptr);

  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int l = 0; l < 3; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
      expected.insert(p + n);
  }
  EXPECT_EQ(names_of(*c), expected);
  EXPECT_EQ(shape(*c, "model.embed_tokens.weight"), (std::vector<int64_t>{100, 48}));
  EXPECT_EQ(shape(*c, "lm_head.weight"), (std::vector<int64_t>{100, 48}));
  EXPECT_EQ(shape(*c, "model.layers.2.self_attn.q_proj.weight"), (std::vector<int64_t>{48, 48}));
  EXPECT_EQ(shape(*c, "model.layers.2.self_attn.k_proj.weight"), (std::vector<int64_t>{16, 48}));  // 2 x 8
  EXPECT_EQ(shape(*c, "model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{80, 48}));
  EXPECT_EQ(shape(*c, "model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{48, 80}));
  EXPECT_EQ(shape(*c, "model.norm.weight"), (std::vector<int64_t>{48}));
  EXPECT_EQ(c->find("model.norm.weight")->dtype, DType::kF32);

  const auto& cfg = c->config();
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(cfg["hidden_size"], 48);
  EXPECT_EQ(cfg["num_hidden_layers"], 3);
  EXPECT_EQ(cfg["num_attention_heads"], 6);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["head_dim"], 8);
  EXPECT_EQ(cfg["intermediate_size"], 80);
  EXPECT_EQ(cfg["vocab_size"], 100);
  EXPECT_EQ(cfg["max_position_embeddings"], 256);
  EXPECT_DOUBLE_EQ(cfg["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  if (!::tessera::testing::fixtures_dir().empty()) {
    EXPECT_EQ(keys_of(cfg), fixture_keys("tiny-llama"));
  }
}

TEST_F(MakeCheckpointTest, WeightsHaveTheIntendedDistribution) {
  ASSERT_EQ(make("stats", "--arch llama --hidden 64 --vocab 1000 --seed 3").exit_code, 0);
  auto c = open("stats");
  ASSERT_NE(c, nullptr);
  auto moments = [&](const std::string& name, double* mean, double* std) {
    auto t = c->load(name, DType::kF32);
    ASSERT_TRUE(t.is_ok());
    double s = 0, s2 = 0;
    int64_t n = t.value().numel();
    for (int64_t i = 0; i < n; ++i) {
      double x = t.value().data<float>()[i];
      s += x;
      s2 += x * x;
    }
    *mean = s / n;
    *std = std::sqrt(s2 / n - *mean * *mean);
  };
  double mean, std;
  moments("model.embed_tokens.weight", &mean, &std);  // 64000 samples
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std, 0.02, 0.001);
  moments("model.norm.weight", &mean, &std);
  EXPECT_NEAR(mean, 1.0, 0.01);
  EXPECT_LT(std, 0.05);
}

TEST_F(MakeCheckpointTest, TiedLlamaHasNoLmHead) {
  ASSERT_EQ(make("tied", "--arch llama --tie-embeddings").exit_code, 0);
  auto c = open("tied");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->find("lm_head.weight"), nullptr);
  EXPECT_NE(c->find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(c->config()["tie_word_embeddings"], true);
}

TEST_F(MakeCheckpointTest, MixtralExperts) {
  auto r = make("mixtral", "--arch mixtral --hidden 32 --layers 2 --heads 4 --kv-heads 1 --ffn 24 --vocab 64 "
                           "--experts 3 --top-k 2 --dtype bfloat16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto c = open("mixtral");
  ASSERT_NE(c, nullptr);
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  for (int l = 0; l < 2; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "block_sparse_moe.gate.weight", "input_layernorm.weight",
                          "post_attention_layernorm.weight"})
      expected.insert(p + n);
    for (int e = 0; e < 3; ++e)
      for (const char* w : {"w1", "w2", "w3"})
        expected.insert(p + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight");
  }
  EXPECT_EQ(names_of(*c), expected);
  EXPECT_EQ(shape(*c, "model.layers.1.block_sparse_moe.gate.weight"), (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(shape(*c, "model.layers.1.block_sparse_moe.experts.2.w1.weight"), (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(shape(*c, "model.layers.1.block_sparse_moe.experts.2.w2.weight"), (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(shape(*c, "model.layers.1.block_sparse_moe.experts.2.w3.weight"), (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(shape(*c, "model.layers.0.self_attn.v_proj.weight"), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(c->find("model.layers.0.self_attn.v_proj.weight")->dtype, DType::kBF16);
  const auto& cfg = c->config();
  EXPECT_EQ(cfg["model_type"], "mixtral");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(cfg["num_local_experts"], 3);
  EXPECT_EQ(cfg["num_experts_per_tok"], 2);
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_DOUBLE_EQ(cfg["rope_theta"].get<double>(), 1e6);
  if (!::tessera::testing::fixtures_dir().empty()) {
    EXPECT_EQ(keys_of(cfg), fixture_keys("tiny-mixtral"));
  }
}

TEST_F(MakeCheckpointTest, BloomNamesShapesAndConfig) {
  auto r = make("bloom", "--arch bloom --hidden 48 --layers 2 --heads 6 --vocab 90 --dtype float16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto c = open("bloom");
  ASSERT_NE(c, nullptr);
  std::set<std::string> expected = {"transformer.word_embeddings.weight", "transformer.word_embeddings_layernorm.weight",
                                    "transformer.word_embeddings_layernorm.bias", "transformer.ln_f.weight",
                                    "transformer.ln_f.bias"};
  for (int l = 0; l < 2; ++l) {
    std::string p = "transformer.h." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "self_attention.query_key_value", "self_attention.dense",
                          "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"}) {
      expected.insert(p + n + ".weight");
      expected.insert(p + n + ".bias");
    }
  }
  EXPECT_EQ(names_of(*c), expected);
  EXPECT_EQ(shape(*c, "transformer.word_embeddings.weight"), (std::vector<int64_t>{90, 48}));
  EXPECT_EQ(shape(*c, "transformer.h.1.self_attention.query_key_value.weight"), (std::vector<int64_t>{144, 48}));
  EXPECT_EQ(shape(*c, "transformer.h.1.self_attention.query_key_value.bias"), (std::vector<int64_t>{144}));
  EXPECT_EQ(shape(*c, "transformer.h.0.mlp.dense_h_to_4h.weight"), (std::vector<int64_t>{192, 48}));
  EXPECT_EQ(shape(*c, "transformer.h.0.mlp.dense_4h_to_h.weight"), (std::vector<int64_t>{48, 192}));
  EXPECT_EQ(c->find("transformer.ln_f.bias")->dtype, DType::kF16);
  const auto& cfg = c->config();
  EXPECT_EQ(cfg["model_type"], "bloom");
  EXPECT_EQ(cfg["architectures"], nlohmann::json::array({"BloomForCausalLM"}));
  EXPECT_EQ(cfg["n_head"], 6);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["hidden_size"], 48);
  EXPECT_EQ(cfg["torch_dtype"], "float16");
  if (!::tessera::testing::fixtures_dir().empty()) {
    EXPECT_EQ(keys_of(cfg), fixture_keys("tiny-bloom"));
  }
}

TEST_F(MakeCheckpointTest, ShardedRunWritesIndexWithTheSameWeights) {
  const std::string model = "--arch llama --hidden 64 --vocab 2048 --seed 11";
  ASSERT_EQ(make("single", model).exit_code, 0);
  auto r = make("sharded", model + " --shard-mb 0.3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir_ + "/sharded/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir_ + "/sharded/model.safetensors"));
  auto single = open("single");
  auto sharded = open("sharded");
  ASSERT_NE(single, nullptr);
  ASSERT_NE(sharded, nullptr);
  EXPECT_GE(sharded->files().size(), 3u);  // 2 x 512 KB embeddings alone need separate shards
  // Each shard keeps under the limit, unless one tensor alone exceeds it (as transformers does).
  for (const auto& f : sharded->files()) {
    size_t data = 0;
    for (const auto& t : f->tensors()) data += t.nbytes;
    if (f->tensors().size() > 1) {
      EXPECT_LE(data, 300000u) << f->path();
    }
  }
  ASSERT_EQ(sharded->tensor_names(), single->tensor_names());
  EXPECT_EQ(sharded->total_bytes(), single->total_bytes());
  for (const auto& name : single->tensor_names()) {
    const TensorInfo* a = single->find(name);
    const TensorInfo* b = sharded->find(name);
    ASSERT_EQ(a->nbytes, b->nbytes);
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << name << ": sharding must not change weights";
  }
  // A different seed gives different weights.
  ASSERT_EQ(make("other", "--arch llama --hidden 64 --vocab 2048 --seed 12").exit_code, 0);
  auto other = open("other");
  ASSERT_NE(other, nullptr);
  const TensorInfo* a = single->find("model.embed_tokens.weight");
  EXPECT_NE(std::memcmp(a->data, other->find("model.embed_tokens.weight")->data, a->nbytes), 0);

  // Re-running unsharded into the sharded folder replaces the old shards.
  ASSERT_EQ(make("sharded", model).exit_code, 0);
  auto redone = open("sharded");
  ASSERT_NE(redone, nullptr);
  EXPECT_EQ(redone->files().size(), 1u);
}

// --format bin writes what torch.save writes (pytorch_model.bin, or shards +
// pytorch_model.bin.index.json), with the same weights as the safetensors output.
TEST_F(MakeCheckpointTest, BinFormatWritesTorchZipFilesWithTheSameWeights) {
  const std::string model = "--arch llama --hidden 64 --vocab 2048 --seed 11 --dtype bfloat16";
  ASSERT_EQ(make("st", model).exit_code, 0);
  auto r = make("bin", model + " --format bin");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir_ + "/bin/pytorch_model.bin"));
  r = make("bin_sharded", model + " --format bin --shard-mb 0.2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir_ + "/bin_sharded/pytorch_model.bin.index.json"));
  auto sharded = open("bin_sharded");
  ASSERT_NE(sharded, nullptr);
  EXPECT_GE(sharded->files().size(), 2u);
  for (const auto& f : sharded->files()) {
    const std::string file = fs::path(f->path()).filename().string();
    EXPECT_TRUE(file.rfind("pytorch_model-0000", 0) == 0 && file.find("-of-0000") != std::string::npos) << file;
  }
  auto st = open("st");
  ASSERT_NE(st, nullptr);
  for (const char* out : {"bin", "bin_sharded"}) {
    auto bin = open(out);
    ASSERT_NE(bin, nullptr);
    ASSERT_EQ(bin->tensor_names(), st->tensor_names()) << out;
    for (const auto& name : st->tensor_names()) {
      const TensorInfo* a = st->find(name);
      const TensorInfo* b = bin->find(name);
      EXPECT_EQ(b->dtype, DType::kBF16);
      EXPECT_EQ(b->stored_dtype, "BFloat16Storage");
      ASSERT_EQ(a->nbytes, b->nbytes);
      EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << out << ": " << name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 64, 0u) << "storages are 64-byte aligned, as torch writes them";
    }
  }
  // Safetensors output into the folder removes the .bin files of an earlier run.
  ASSERT_EQ(make("bin", model).exit_code, 0);
  EXPECT_FALSE(fs::exists(dir_ + "/bin/pytorch_model.bin"));
}

// The real torch.load reads the files (CRC-32s, zip layout, pickle): only where a Python
// with torch exists (/usr/bin/python3 here); the product never needs it.
TEST_F(MakeCheckpointTest, BinFormatLoadsWithRealTorchWhereAvailable) {
  if (run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null").exit_code != 0)
    GTEST_SKIP() << "SKIPPED: no /usr/bin/python3 with torch to cross-check the .bin writer";
  ASSERT_EQ(make("bin", "--arch bloom --hidden 64 --heads 4 --vocab 512 --layers 2 --format bin --seed 3").exit_code, 0);
  auto c = open("bin");
  ASSERT_NE(c, nullptr);
  // torch.load, then every tensor's name, dtype, shape and bytes (sorted by name) into one
  // file, compared with what Tessera's reader sees.
  const std::string script = dir_ + "/check.py";
  ::tessera::testing::write_file(script, R"(import sys, torch
sd = torch.load(sys.argv[1], map_location="cpu")
with open(sys.argv[2], "wb") as out:
    for k in sorted(sd):
        t = sd[k]
        out.write(("%s %s %s\n" % (k, t.dtype, list(t.shape))).encode())
        out.write(t.contiguous().numpy().tobytes())
)");
  auto r = run_command("/usr/bin/python3 " + script + " " + dir_ + "/bin/pytorch_model.bin " + dir_ + "/torch.out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string want;
  for (const auto& name : c->tensor_names()) {
    const TensorInfo* t = c->find(name);
    std::string dims;
    for (size_t i = 0; i < t->shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(t->shape[i]);
    want += name + " torch.float32 [" + dims + "]\n";
    want.append(static_cast<const char*>(t->data), t->nbytes);
  }
  const std::string got = ::tessera::testing::read_file(dir_ + "/torch.out");
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "torch.load sees different tensors than the writer wrote";
}

// --config-set edits config.json before the tensor list is derived from it: Falcon-7B's
// multi-query layout instead of the default new_decoder_architecture.
TEST_F(MakeCheckpointTest, ConfigSetChangesTheTensorsWritten) {
  auto r = make("falcon", "--arch falcon --hidden 64 --layers 1 --heads 4 --kv-heads 2 --ffn 128 --vocab 64 "
                          "--config-set new_decoder_architecture=false --config-set multi_query=true "
                          "--config-set parallel_attn=false");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto c = open("falcon");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->config()["new_decoder_architecture"], false);
  EXPECT_EQ(shape(*c, "transformer.h.0.self_attention.query_key_value.weight"), (std::vector<int64_t>{96, 64}));
  EXPECT_NE(c->find("transformer.h.0.input_layernorm.weight"), nullptr);
  EXPECT_NE(c->find("transformer.h.0.post_attention_layernorm.weight"), nullptr);
  EXPECT_EQ(c->find("transformer.h.0.ln_attn.weight"), nullptr);
  auto bad = make("bad", "--arch falcon --config-set alibi=true");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("alibi"), std::string::npos) << bad.err;
  auto malformed = make("bad", "--arch llama --config-set novalue");
  EXPECT_NE(malformed.exit_code, 0);
  EXPECT_NE(malformed.err.find("KEY=VALUE"), std::string::npos) << malformed.err;
}

TEST_F(MakeCheckpointTest, BadFlagsFailWithClearMessages) {
  auto unknown = make("bad", "--arch mamba");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE((unknown.err + unknown.out).find("mamba"), std::string::npos) << unknown.err;

  auto heads = make("bad", "--arch llama --hidden 64 --heads 5");
  EXPECT_NE(heads.exit_code, 0);
  EXPECT_NE(heads.err.find("--heads 5 does not divide --hidden 64"), std::string::npos) << heads.err;

  auto kv = make("bad", "--arch llama --heads 4 --kv-heads 3");
  EXPECT_NE(kv.exit_code, 0);
  EXPECT_NE(kv.err.find("--kv-heads"), std::string::npos) << kv.err;

  auto topk = make("bad", "--arch mixtral --experts 2 --top-k 3");
  EXPECT_NE(topk.exit_code, 0);
  EXPECT_NE(topk.err.find("--top-k"), std::string::npos) << topk.err;

  auto bloom_gqa = make("bad", "--arch bloom --heads 4 --kv-heads 2");
  EXPECT_NE(bloom_gqa.exit_code, 0);
  EXPECT_NE(bloom_gqa.err.find("--kv-heads"), std::string::npos) << bloom_gqa.err;

  auto no_out = run_command(program_ + " --arch llama");
  EXPECT_NE(no_out.exit_code, 0);
  EXPECT_NE((no_out.err + no_out.out).find("--out"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/bad/model.safetensors")) << "nothing written on bad flags";
}

// A padded copy computes the original's logits: kjv-llama grown from 6 to 8 layers and from
// FFN 512 to 640 has the same held-out perplexity (tessera-perplexity, f32), the new layers'
// output projections are zero, and the original's rows are kept as they were.
TEST_F(MakeCheckpointTest, PaddedCopyHasTheOriginalsPerplexity) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string kjv = ::tessera::testing::fixtures_dir() + "/kjv-llama";
  auto r = make("padded", "--pad-from '" + kjv + "' --layers 8 --ffn 640 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto c = open("padded");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(shape(*c, "model.layers.7.mlp.down_proj.weight"), (std::vector<int64_t>{192, 640}));
  EXPECT_EQ(shape(*c, "model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{640, 192}));
  auto down = c->load("model.layers.7.mlp.down_proj.weight", DType::kF32);
  auto o = c->load("model.layers.6.self_attn.o_proj.weight", DType::kF32);
  auto q = c->load("model.layers.6.self_attn.q_proj.weight", DType::kF32);
  ASSERT_TRUE(down.is_ok() && o.is_ok() && q.is_ok());
  double zero_sum = 0, q_sum = 0;
  for (int64_t i = 0; i < down->numel(); ++i) zero_sum += std::fabs(down->data<float>()[i]);
  for (int64_t i = 0; i < o->numel(); ++i) zero_sum += std::fabs(o->data<float>()[i]);
  for (int64_t i = 0; i < q->numel(); ++i) q_sum += std::fabs(q->data<float>()[i]);
  EXPECT_EQ(zero_sum, 0.0) << "a new layer's output projections must be zero";
  EXPECT_GT(q_sum, 0.0) << "its other weights are random";
  // Under the sanitizers the first 3 of the 24 held-out lines: the equality holds on any text.
  std::string text = kjv + "/heldout.txt";
  if (::tessera::testing::kSanitizedBuild) {
    std::ifstream in(text);
    std::ofstream head(dir_ + "/heldout-head.txt");
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) head << line << "\n";
    text = dir_ + "/heldout-head.txt";
  }
  auto perplexity = [&](const std::string& model) {
    const auto p = run_command(::tessera::testing::bin_dir() + "/tessera-perplexity --model '" + model +
                               "' --text-file '" + text + "' --json");
    EXPECT_EQ(p.exit_code, 0) << p.err;
    return nlohmann::json::parse(p.out.substr(p.out.find('{'))).value("perplexity", 0.0);
  };
  const double original = perplexity(kjv), padded = perplexity(dir_ + "/padded");
  EXPECT_NEAR(padded, original, 1e-6 * original);
  std::cout << "[ REPORT   ] kjv-llama perplexity " << original << ", padded copy " << padded << std::endl;
}

TEST_F(MakeCheckpointTest, PaddingRefusesWhatItCannotPadNamingIt) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string fixtures = ::tessera::testing::fixtures_dir();
  const std::vector<std::pair<std::string, std::string>> refusals = {
      {"tiny-mixtral' --layers 4 --ffn 256", "only dense models can be padded"},
      {"kjv-llama' --layers 4 --ffn 640", "--layers 4 is fewer than the 6 layers"},
      {"kjv-llama' --layers 8 --ffn 640 --hidden 64", "--hidden does not apply to --pad-from"},
      {"kjv-llama' --ffn 640", "--pad-from needs --layers and --ffn"},
      {"tiny-gemma2' --layers 4 --ffn 256", "its layers differ"},
  };
  for (const auto& [args, needle] : refusals) {
    auto r = make("bad", "--pad-from '" + fixtures + "/" + args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/bad/model.safetensors")) << "nothing written on refusals";
}

}  // namespace
}  // namespace tessera
