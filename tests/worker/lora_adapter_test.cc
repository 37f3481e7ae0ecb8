// PEFT LoRA adapter folders read against their base (worker/lora_adapter.h): adapters written
// here as PEFT writes them (adapter_config.json, adapter_model.safetensors with
// base_model.model.<module>.lora_A/B.weight) for tiny-llama (separate projections), tiny-gpt2
// (Conv1D weights stored [in, out]) and tiny-mixtral (routed experts) load with every factor as
// written; what is not implemented or does not fit the base is refused naming the file and the
// field or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/safetensors_writer.h"
#include "tests/common/torch_file_builder.h"
#include "tests/test_support.h"
#include "worker/lora_adapter.h"
#include "worker/model_checkpoint.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Factor {
  std::string name;
  std::vector<float> values;
  std::vector<int64_t> shape;
};

// A random [rows, cols] factor (seeded by its name, so the test can check what it wrote).
Factor factor(const std::string& name, int64_t rows, int64_t cols) {
  Factor f{name, std::vector<float>(static_cast<size_t>(rows * cols)), {rows, cols}};
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(name)));
  std::normal_distribution<float> n(0.0f, 0.02f);
  for (float& v : f.values) v = n(rng);
  return f;
}

class AdapterDir {
 public:
  AdapterDir() : dir_(testing::make_temp_dir("tessera-lora")) {}
  ~AdapterDir() { fs::remove_all(dir_); }
  const std::string& path() const { return dir_; }

  void write(const nlohmann::json& config, const std::vector<Factor>& factors) {
    std::ofstream(dir_ + "/adapter_config.json") << config.dump(2);
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const Factor& f : factors)
      tensors.emplace_back(f.name, TensorView(const_cast<float*>(f.values.data()), DType::kF32, f.shape));
    ASSERT_TRUE(write_safetensors(dir_ + "/adapter_model.safetensors", tensors).is_ok());
  }

 private:
  std::string dir_;
};

struct Base {
  std::unique_ptr<Checkpoint> checkpoint;
  ModelConfig config;
};

Base open_base(const std::string& fixture) {
  Base b;
  auto ckpt = Checkpoint::open(testing::fixtures_dir() + "/" + fixture);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  b.checkpoint = std::move(ckpt).value();
  auto config = parse_model_config(b.checkpoint->config(), b.checkpoint->config_source());
  EXPECT_TRUE(config.is_ok()) << config.status().to_string();
  b.config = std::move(config).value();
  return b;
}

nlohmann::json peft_config(int r, nlohmann::json targets) {
  return {{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"r", r},          {"lora_alpha", 16},
          {"lora_dropout", 0.05}, {"bias", "none"},          {"use_dora", false}, {"modules_to_save", nullptr},
          {"rank_pattern", nlohmann::json::object()},         {"target_modules", targets}};
}

std::string lora_name(const std::string& module, char which) {
  return "base_model.model." + module + ".lora_" + which + ".weight";
}

void expect_factor(const Tensor& t, const Factor& f) {
  ASSERT_EQ(t.view().ndim, 2);
  ASSERT_EQ(t.dim(0), f.shape[0]);
  ASSERT_EQ(t.dim(1), f.shape[1]);
  const auto* p = static_cast<const float*>(t.view().data);
  for (size_t i = 0; i < f.values.size(); ++i) ASSERT_EQ(p[i], f.values[i]) << f.name << " element " << i;
}

TEST(LoraAdapterConfig, FieldsAreReadAndWhatIsNotImplementedIsRefusedByName) {
  auto ok = parse_lora_adapter_config(peft_config(8, {"q_proj", "v_proj"}), "a.json");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->rank, 8);
  EXPECT_DOUBLE_EQ(ok->scale(), 2.0);  // 16 / 8
  EXPECT_TRUE(ok->targets("model.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(ok->targets("model.layers.3.self_attn.xq_proj"));
  EXPECT_FALSE(ok->targets("model.layers.3.self_attn.o_proj"));
  nlohmann::json rs = peft_config(16, ".*\\.(q|k)_proj");
  rs["use_rslora"] = true;
  auto rslora = parse_lora_adapter_config(rs, "a.json");
  ASSERT_TRUE(rslora.is_ok()) << rslora.status().to_string();
  EXPECT_DOUBLE_EQ(rslora->scale(), 4.0);  // 16 / sqrt(16)
  EXPECT_TRUE(rslora->targets("model.layers.0.self_attn.k_proj"));
  EXPECT_FALSE(rslora->targets("model.layers.0.self_attn.v_proj"));
  EXPECT_TRUE(parse_lora_adapter_config(peft_config(4, "all-linear"), "a.json")->targets("anything.linear"));

  const std::vector<std::pair<std::string, nlohmann::json>> refused = {
      {"use_dora", true},
      {"modules_to_save", {"lm_head"}},
      {"bias", "lora_only"},
      {"rank_pattern", {{"q_proj", 4}}},
      {"alpha_pattern", {{"q_proj", 4}}},
      {"layers_to_transform", {0, 1}},
      {"peft_type", "IA3"},
      {"r", 0},
      {"r", "8"},
      {"lora_alpha", "sixteen"},
      {"use_rslora", "yes"},
      {"target_modules", nullptr},
      {"target_modules", "(unclosed"},
      {"target_modules", nlohmann::json::array()},
  };
  for (const auto& [field, value] : refused) {
    nlohmann::json j = peft_config(8, {"q_proj"});
    j[field] = value;
    auto bad = parse_lora_adapter_config(j, "dir/adapter_config.json");
    ASSERT_FALSE(bad.is_ok()) << field << " = " << value.dump();
    EXPECT_EQ(bad.status().message().rfind("dir/adapter_config.json: " + field + ": ", 0), 0u) << bad.status().to_string();
  }
}

TEST(LoraAdapter, EveryFactorOfEveryTargetedModuleLoadsAsWritten) {
  TESSERA_REQUIRE_FIXTURES();
  const Base base = open_base("tiny-llama");
  const int64_t hidden = base.config.hidden, r = 4;
  const int64_t q_out = base.config.heads * base.config.head_dim, kv_out = base.config.kv_heads * base.config.head_dim;
  std::vector<Factor> written;
  for (int l = 0; l < base.config.layers; ++l) {
    const std::string q = "model.layers." + std::to_string(l) + ".self_attn.q_proj";
    const std::string v = "model.layers." + std::to_string(l) + ".self_attn.v_proj";
    const std::string down = "model.layers." + std::to_string(l) + ".mlp.down_proj";
    written.push_back(factor(lora_name(q, 'A'), r, hidden));
    written.push_back(factor(lora_name(q, 'B'), q_out, r));
    written.push_back(factor(lora_name(v, 'A'), r, hidden));
    written.push_back(factor(lora_name(v, 'B'), kv_out, r));
    written.push_back(factor(lora_name(down, 'A'), r, base.config.ffn));
    written.push_back(factor(lora_name(down, 'B'), hidden, r));
  }
  AdapterDir dir;
  dir.write(peft_config(static_cast<int>(r), {"q_proj", "v_proj", "down_proj"}), written);
  auto adapter = load_lora_adapter(dir.path(), *base.checkpoint, base.config, 64);
  ASSERT_TRUE(adapter.is_ok()) << adapter.status().to_string();
  ASSERT_EQ(adapter->modules.size(), static_cast<size_t>(3 * base.config.layers));
  for (size_t i = 0; i < adapter->modules.size(); ++i) {
    const LoraModule& m = adapter->modules[i];
    EXPECT_EQ(m.target.layer, static_cast<int>(i / 3));
    const TensorRole want[] = {TensorRole::kQ, TensorRole::kV, TensorRole::kDown};
    EXPECT_EQ(m.target.role, want[i % 3]) << m.target.name;
    const auto a = std::find_if(written.begin(), written.end(), [&](const Factor& f) { return f.name == lora_name(m.target.name, 'A'); });
    const auto b = std::find_if(written.begin(), written.end(), [&](const Factor& f) { return f.name == lora_name(m.target.name, 'B'); });
    ASSERT_TRUE(a != written.end() && b != written.end()) << m.target.name;
    expect_factor(m.a, *a);
    expect_factor(m.b, *b);
  }
}

TEST(LoraAdapter, Gpt2ConvWeightsAndMixtralExpertsTakeTheirBaseLayersShapesAndRoutersAreRefused) {
  TESSERA_REQUIRE_FIXTURES();
  {
    const Base gpt2 = open_base("tiny-gpt2");
    const int64_t h = gpt2.config.hidden;
    AdapterDir dir;
    // c_attn is stored [in, out] = [h, 3h]; its factors are still A [r, in] and B [out, r].
    dir.write(peft_config(2, {"c_attn"}), {factor(lora_name("transformer.h.0.attn.c_attn", 'A'), 2, h),
                                           factor(lora_name("transformer.h.0.attn.c_attn", 'B'), 3 * h, 2)});
    auto a = load_lora_adapter(dir.path(), *gpt2.checkpoint, gpt2.config, 8);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_EQ(a->modules.size(), 1u);
    EXPECT_EQ(a->modules[0].target.role, TensorRole::kQkv);
  }
  {
    const Base mixtral = open_base("tiny-mixtral");
    const int64_t h = mixtral.config.hidden, f = mixtral.config.moe_ffn;
    const std::string w1 = "model.layers.1.block_sparse_moe.experts.1.w1";
    AdapterDir dir;
    dir.write(peft_config(2, {"w1"}), {factor(lora_name(w1, 'A'), 2, h), factor(lora_name(w1, 'B'), f, 2)});
    auto a = load_lora_adapter(dir.path(), *mixtral.checkpoint, mixtral.config, 8);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_EQ(a->modules.size(), 1u);
    EXPECT_EQ(a->modules[0].target.role, TensorRole::kExpertGate);
    EXPECT_EQ(a->modules[0].target.layer, 1);
    EXPECT_EQ(a->modules[0].target.expert, 1);
  }
  {
    // PEFT's all-linear takes Mixtral's router (an nn.Linear) too: refused by what it is.
    const Base mixtral = open_base("tiny-mixtral");
    const std::string router = "model.layers.0.block_sparse_moe.gate";
    AdapterDir dir;
    dir.write(peft_config(2, "all-linear"), {factor(lora_name(router, 'A'), 2, mixtral.config.hidden),
                                             factor(lora_name(router, 'B'), mixtral.config.num_experts, 2)});
    auto a = load_lora_adapter(dir.path(), *mixtral.checkpoint, mixtral.config, 8);
    ASSERT_FALSE(a.is_ok());
    EXPECT_NE(a.status().message().find("'" + router + "' is the MoE router: adapters of it are not implemented"),
              std::string::npos)
        << a.status().to_string();
  }
}

TEST(LoraAdapter, AdaptersThatDoNotFitTheBaseAreRefusedNamingTheFileAndTensor) {
  TESSERA_REQUIRE_FIXTURES();
  const Base base = open_base("tiny-llama");
  const int64_t h = base.config.hidden, q_out = base.config.heads * base.config.head_dim;
  const std::string q = "model.layers.0.self_attn.q_proj";
  struct Case {
    const char* what;
    nlohmann::json config;
    std::vector<Factor> factors;
    std::string expect;  // in the message, after the file's path
  };
  const std::vector<Case> cases = {
      {"A wider than the layer", peft_config(4, {"q_proj"}),
       {factor(lora_name(q, 'A'), 4, h + 1), factor(lora_name(q, 'B'), q_out, 4)},
       "adapter_model.safetensors: " + lora_name(q, 'A') + ": shape [4, " + std::to_string(h + 1) + "], expected [4, " +
           std::to_string(h) + "]"},
      {"B of another rank", peft_config(4, {"q_proj"}),
       {factor(lora_name(q, 'A'), 4, h), factor(lora_name(q, 'B'), q_out, 3)},
       lora_name(q, 'B') + ": shape"},
      {"a module the base lacks", peft_config(4, {"rotary_emb"}),
       {factor(lora_name("model.layers.0.self_attn.rotary_emb", 'A'), 4, h),
        factor(lora_name("model.layers.0.self_attn.rotary_emb", 'B'), h, 4)},
       "'model.layers.0.self_attn.rotary_emb' is not a linear layer of the base's blocks (llama)"},
      {"a module not targeted", peft_config(4, {"k_proj"}),
       {factor(lora_name(q, 'A'), 4, h), factor(lora_name(q, 'B'), q_out, 4)},
       "'" + q + "' is not among adapter_config.json's target_modules"},
      {"A without B", peft_config(4, {"q_proj"}), {factor(lora_name(q, 'A'), 4, h)}, q + ": has lora_A without its pair"},
      {"a DoRA magnitude", peft_config(4, {"q_proj"}),
       {factor(lora_name(q, 'A'), 4, h), factor(lora_name(q, 'B'), q_out, 4),
        factor("base_model.model." + q + ".lora_magnitude_vector", 1, q_out)},
       "DoRA is not implemented"},
      {"an embedding adapter", peft_config(4, {"embed_tokens"}),
       {factor("base_model.model.model.embed_tokens.lora_embedding_A", 4, base.config.vocab)},
       "adapters of the embedding are not implemented"},
      {"rank above max_rank", peft_config(128, {"q_proj"}), {}, "adapter_config.json: r: 128 is above lora.max_rank 64"},
  };
  for (const Case& c : cases) {
    AdapterDir dir;
    dir.write(c.config, c.factors);
    auto a = load_lora_adapter(dir.path(), *base.checkpoint, base.config, 64);
    ASSERT_FALSE(a.is_ok()) << c.what;
    EXPECT_NE(a.status().message().find(dir.path() + "/"), std::string::npos) << c.what << ": " << a.status().to_string();
    EXPECT_NE(a.status().message().find(c.expect), std::string::npos) << c.what << ": " << a.status().to_string();
  }
  AdapterDir empty;
  std::ofstream(empty.path() + "/adapter_config.json") << peft_config(4, {"q_proj"}).dump();
  auto missing = load_lora_adapter(empty.path(), *base.checkpoint, base.config, 64);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("no adapter_model.safetensors or adapter_model.bin"), std::string::npos);
  // adapter_model.bin is a pickle: one naming a forbidden global is refused by name, never run.
  AdapterDir evil;
  std::ofstream(evil.path() + "/adapter_config.json") << peft_config(4, {"q_proj"}).dump();
  testing::PickleBuilder pickle;
  pickle.proto().global("os", "system").str("touch " + evil.path() + "/pwned").op('\x85').op('R').op('.');
  std::ofstream(evil.path() + "/adapter_model.bin", std::ios::binary) << testing::torch_zip(pickle.bytes(), {});
  auto refused = load_lora_adapter(evil.path(), *base.checkpoint, base.config, 64);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find(evil.path() + "/adapter_model.bin"), std::string::npos) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("'os.system'"), std::string::npos) << refused.status().to_string();
  EXPECT_FALSE(fs::exists(evil.path() + "/pwned"));
  auto nowhere = load_lora_adapter(empty.path() + "/nope", *base.checkpoint, base.config, 64);
  ASSERT_FALSE(nowhere.is_ok());
  EXPECT_NE(nowhere.status().message().find("nope/adapter_config.json: cannot be read"), std::string::npos);
}

// A GGUF base presents its tensors under the Hugging Face names (Q/K rows un-permuted), so a
// PEFT adapter finds every module it targets there, with the base layers' shapes; a file that
// is no adapter is refused as what it is.
TEST(LoraAdapter, AGgufBaseTakesAdaptersUnderItsHuggingFaceNames) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string gguf = testing::fixtures_dir() + "/gguf/gguf-llama-Q4_K_M.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << "SKIPPED: " << gguf << " not found";
  auto ckpt = open_model_checkpoint(gguf);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto config = parse_model_config((*ckpt)->config(), (*ckpt)->config_source());
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  const int64_t hidden = config->hidden, r = 4, kv_out = config->kv_heads * config->head_dim;
  std::vector<Factor> written;
  for (int l = 0; l < config->layers; ++l) {
    const std::string k = "model.layers." + std::to_string(l) + ".self_attn.k_proj";
    const std::string up = "model.layers." + std::to_string(l) + ".mlp.up_proj";
    written.push_back(factor(lora_name(k, 'A'), r, hidden));
    written.push_back(factor(lora_name(k, 'B'), kv_out, r));
    written.push_back(factor(lora_name(up, 'A'), r, hidden));
    written.push_back(factor(lora_name(up, 'B'), config->ffn, r));
  }
  AdapterDir dir;
  dir.write(peft_config(static_cast<int>(r), {"k_proj", "up_proj"}), written);
  auto adapter = load_lora_adapter(dir.path(), **ckpt, *config, 64);
  ASSERT_TRUE(adapter.is_ok()) << adapter.status().to_string();
  ASSERT_EQ(adapter->modules.size(), static_cast<size_t>(2 * config->layers));
  for (const LoraModule& m : adapter->modules) {
    EXPECT_TRUE(m.target.role == TensorRole::kK || m.target.role == TensorRole::kUp) << m.target.name;
    const auto b = std::find_if(written.begin(), written.end(), [&](const Factor& f) { return f.name == lora_name(m.target.name, 'B'); });
    ASSERT_TRUE(b != written.end()) << m.target.name;
    expect_factor(m.b, *b);
  }
  // A model file given as an adapter is named as what it is.
  auto model = load_lora_adapter(gguf, **ckpt, *config, 64);
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().message().find("not 'adapter': a GGUF model, not a LoRA adapter"), std::string::npos)
      << model.status().to_string();
  // So is any other file.
  auto other = load_lora_adapter(dir.path() + "/adapter_config.json", **ckpt, *config, 64);
  ASSERT_FALSE(other.is_ok());
  EXPECT_NE(other.status().message().find("is a file; a LoRA adapter is a PEFT folder"), std::string::npos)
      << other.status().to_string();
}

}  // namespace
}  // namespace tessera
