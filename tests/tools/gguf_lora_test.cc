// LoRA adapters and GGUF files (worker/lora_adapter.h, worker/gguf_lora_adapter.h), through
// tessera-generate as a user runs it:
//  - a PEFT adapter on a GGUF base: tiny-llama converted as llama.cpp's converter converts it
//    (f32; Q and K rows permuted in the file, tests/worker/gguf_from_hf.h) serves an adapter
//    written for the folder with the folder's logits (the same weights: within 1e-5, and at
//    tensor-parallel 2 within 1e-4), while the adapter moves them; kjv-llama's 4-bit file (its
//    q4_0 blocks as panels) serves an adapter of the kjv-llama folder;
//  - llama.cpp's GGUF adapter (written here as convert_lora_to_gguf.py writes it from the same
//    PEFT adapter: lora_b of Q and K permuted as the base's rows, experts' factors stacked)
//    gives the PEFT adapter's logits on the folder and on the GGUF base, for tiny-llama and
//    tiny-mixtral; what it cannot mean is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <tuple>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/safetensors.h"
#include "tests/common/gguf_test_writer.h"
#include "tests/test_support.h"
#include "tests/worker/gguf_from_hf.h"
#include "tests/worker/golden_model_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Workspace {
  std::string dir = testing::make_temp_dir("tessera-gguf-lora");
  ~Workspace() { fs::remove_all(dir); }
};

std::string make_adapter(const std::string& model, const std::string& out, int seed) {
  const testing::CommandResult made =
      testing::run_command(testing::bin_dir() + "/tessera-make-checkpoint --lora-of '" + model + "' --out '" + out +
                           "' --lora-rank 8 --lora-alpha 32 --seed " + std::to_string(seed));
  EXPECT_EQ(made.exit_code, 0) << made.err;
  return out;
}

// The golden prompts of `folder` as a --prompt-ids-file.
std::string prompts_file(const std::string& folder, const std::string& path) {
  std::string text;
  for (const testing::GoldenIds& c : testing::read_golden_ids(folder)) {
    std::string line;
    for (int32_t id : c.prompt) line += (line.empty() ? "" : ",") + std::to_string(id);
    text += line + "\n";
  }
  testing::write_file(path, text);
  return path;
}

// Every generated row's logits (greedy, 6 tokens a prompt), with the adapter at `adapter` for
// every prompt when it is not empty.
std::vector<float> logits(const Workspace& w, const std::string& model, const std::string& prompts,
                          const std::string& adapter, const std::string& extra = "") {
  const std::string out = w.dir + "/logits-" + std::to_string(std::hash<std::string>{}(model + adapter + extra));
  std::string cmd = testing::bin_dir() + "/tessera-generate --model '" + model + "' --dtype float32 --threads 1 " +
                    "--max-new-tokens 6 --prompt-ids-file '" + prompts + "' --dump-logits '" + out + "' " + extra;
  if (!adapter.empty()) cmd += " --lora a='" + adapter + "' --prompt-lora a";
  const testing::CommandResult r = testing::run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
  return r.exit_code == 0 ? testing::read_f32_file(out) : std::vector<float>{};
}

float largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? worst : INFINITY;
}

TEST(GgufLora, AnAdapterOnTheFileGivesTheFoldersLogits) {
  TESSERA_REQUIRE_FIXTURES();
  Workspace w;
  const std::string folder = testing::fixtures_dir() + "/tiny-llama";
  auto conv = testing::gguf_from_hf(folder);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  const std::string gguf = w.dir + "/tiny-llama-F32.gguf";
  testing::write_file(gguf, conv->writer.build());
  const std::string adapter = make_adapter(folder, w.dir + "/adapter", 5);
  const std::string prompts = prompts_file(folder, w.dir + "/prompts.txt");

  const std::vector<float> base = logits(w, folder, prompts, "");
  const std::vector<float> want = logits(w, folder, prompts, adapter);
  const std::vector<float> got = logits(w, gguf, prompts, adapter);
  const std::vector<float> got_tp2 = logits(w, gguf, prompts, adapter, "--tensor-parallel 2");
  ASSERT_FALSE(want.empty());
  const float moved = largest_difference(want, base);
  const float file = largest_difference(got, want), tp2 = largest_difference(got_tp2, got);
  std::cout << "[ report ] tiny-llama with an adapter: the adapter moves the logits up to " << moved
            << "; the GGUF file against the folder " << file << ", at tensor-parallel 2 " << tp2 << std::endl;
  EXPECT_GT(moved, 1e-2f) << "the adapter must change the logits for this test to mean anything";
  EXPECT_LE(file, 1e-5f);
  EXPECT_LE(tp2, 1e-4f);
}

TEST(GgufLora, AFourBitFileServesAnAdapterOfItsFolder) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string folder = testing::fixtures_dir() + "/kjv-llama";
  const std::string gguf = testing::fixtures_dir() + "/gguf/kjv-llama-Q4_0.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << "SKIPPED: " << gguf << " not found";
  Workspace w;
  const std::string adapter = make_adapter(folder, w.dir + "/adapter", 9);
  const std::string prompts = prompts_file(folder, w.dir + "/prompts.txt");
  const std::vector<float> base = logits(w, gguf, prompts, "");
  const std::vector<float> adapted = logits(w, gguf, prompts, adapter);
  ASSERT_FALSE(adapted.empty());
  EXPECT_GT(largest_difference(adapted, base), 1e-2f);
}

// The GGUF adapter llama.cpp's convert_lora_to_gguf.py writes for a PEFT adapter of a Llama
// or Mixtral (LlamaModel.modify_tensors on its LoraTorchTensor): each factor named after the
// base's GGUF tensor plus ".lora_a" / ".lora_b", in ggml's shapes [in, r] and [r, out], q_proj's
// and k_proj's lora_b rows permuted per head as the base's rows (the permutation moves B only),
// the experts' factors stacked as their weights are ([in, r, experts], [r, out, experts]);
// general.type adapter, adapter.type lora, adapter.lora.alpha from adapter_config.json. `edit`
// may change the writer before the file is built (the refusal cases).
std::string gguf_adapter_from_peft(const std::string& peft, const std::string& out, int64_t heads, int64_t kv_heads,
                                   const std::function<void(testing::GgufTestWriter&)>& edit = {}) {
  using testing::gguf_from_hf_detail::HfTensor;
  const nlohmann::json config = nlohmann::json::parse(testing::read_file(peft + "/adapter_config.json"));
  auto file = SafetensorsFile::open(peft + "/adapter_model.safetensors");
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  const std::unique_ptr<Checkpoint> factors = Checkpoint::from_weight_file(peft, nlohmann::json::object(), *file);
  const std::map<std::string, std::string> names = {
      {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}, {"w1", "ffn_gate_exps"}, {"w2", "ffn_down_exps"}, {"w3", "ffn_up_exps"}};
  const std::regex factor(
      R"(base_model\.model\.model\.layers\.(\d+)\.(?:block_sparse_moe\.experts\.(\d+)\.)?(.+)\.lora_([AB])\.weight)");
  testing::GgufTestWriter w;
  w.kv_string("general.architecture", "llama");
  w.kv_string("general.type", "adapter");
  w.kv_string("adapter.type", "lora");
  w.kv_f32("adapter.lora.alpha", config["lora_alpha"].get<float>());
  // By GGUF name: the factor, or each expert's in order.
  std::map<std::string, std::map<int, HfTensor>> stacks;
  for (const TensorInfo& t : (*file)->tensors()) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(t.name, m, factor)) << t.name;
    const std::string module = m[3];
    auto loaded = factors->load(t.name, DType::kF32);
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    HfTensor h{{loaded->dim(0), loaded->dim(1)}, {}};
    h.data.assign(loaded->data<float>(), loaded->data<float>() + loaded->numel());
    if (m[4] == "B" && module == "self_attn.q_proj") h = testing::gguf_from_hf_detail::llama_permute(h, heads);
    if (m[4] == "B" && module == "self_attn.k_proj") h = testing::gguf_from_hf_detail::llama_permute(h, kv_heads);
    const std::string name =
        "blk." + std::string(m[1]) + "." + names.at(module) + ".weight.lora_" + (m[4] == "A" ? "a" : "b");
    stacks[name][m[2].matched ? std::stoi(m[2]) : -1] = std::move(h);
  }
  for (const auto& [name, parts] : stacks) {
    std::string bytes;
    for (const auto& [expert, h] : parts) bytes.append(reinterpret_cast<const char*>(h.data.data()), h.data.size() * 4);
    const HfTensor& first = parts.begin()->second;
    std::vector<uint64_t> dims = {static_cast<uint64_t>(first.shape[1]), static_cast<uint64_t>(first.shape[0])};
    if (parts.begin()->first >= 0) dims.push_back(parts.size());
    w.tensor(name, dims, GgmlType::kF32, bytes);
  }
  if (edit) edit(w);
  testing::write_file(out, w.build());
  return out;
}

class GgufAdapterFile : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufAdapterFile, GivesThePeftAdaptersLogitsOnFolderAndFile) {
  TESSERA_REQUIRE_FIXTURES();
  Workspace w;
  const std::string folder = testing::fixtures_dir() + "/" + GetParam();
  const nlohmann::json hf = nlohmann::json::parse(testing::read_file(folder + "/config.json"));
  const int64_t heads = hf["num_attention_heads"], kv_heads = hf.value("num_key_value_heads", heads);
  auto conv = testing::gguf_from_hf(folder);
  ASSERT_TRUE(conv.is_ok()) << conv.status().to_string();
  const std::string gguf = w.dir + "/base-F32.gguf";
  testing::write_file(gguf, conv->writer.build());
  const std::string peft = make_adapter(folder, w.dir + "/adapter", 11);
  const std::string adapter = gguf_adapter_from_peft(peft, w.dir + "/adapter.gguf", heads, kv_heads);
  const std::string prompts = prompts_file(folder, w.dir + "/prompts.txt");

  const std::vector<float> want = logits(w, folder, prompts, peft);
  const float on_folder = largest_difference(logits(w, folder, prompts, adapter), want);
  const float on_file = largest_difference(logits(w, gguf, prompts, adapter), want);
  const float moved = largest_difference(want, logits(w, folder, prompts, ""));
  std::cout << "[ report ] " << GetParam() << ", llama.cpp's adapter file against the PEFT folder it came from: on the "
            << "folder " << on_folder << ", on the GGUF base " << on_file << " (the adapter moves the logits up to "
            << moved << ")" << std::endl;
  EXPECT_GT(moved, 1e-2f);
  EXPECT_LE(on_folder, 1e-5f);
  EXPECT_LE(on_file, 1e-5f);
}

// tiny-llama: Q and K permuted; tiny-mixtral: its experts' factors stacked.
INSTANTIATE_TEST_SUITE_P(Fixtures, GgufAdapterFile, ::testing::Values("tiny-llama", "tiny-mixtral"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(GgufLora, AdapterFilesThatCannotMeanWhatTheySayAreRefusedByName) {
  TESSERA_REQUIRE_FIXTURES();
  Workspace w;
  const std::string folder = testing::fixtures_dir() + "/tiny-llama";
  const std::string peft = make_adapter(folder, w.dir + "/adapter", 12);
  const std::string prompts = prompts_file(folder, w.dir + "/prompts.txt");
  const nlohmann::json hf = nlohmann::json::parse(testing::read_file(folder + "/config.json"));
  const int64_t heads = hf["num_attention_heads"], kv_heads = hf.value("num_key_value_heads", heads);
  using Edit = std::function<void(testing::GgufTestWriter&)>;
  auto drop = [](const std::string& name) {
    return [name](testing::GgufTestWriter& g) {
      g.tensors.erase(std::remove_if(g.tensors.begin(), g.tensors.end(), [&](const auto& t) { return t.name == name; }),
                      g.tensors.end());
    };
  };
  // The factor `name` replaced by one of ggml shape `dims` (zeros).
  auto reshape = [&drop](const std::string& name, std::vector<uint64_t> dims) {
    return [=](testing::GgufTestWriter& g) {
      drop(name)(g);
      g.tensor(name, dims, GgmlType::kF32);
    };
  };
  const std::vector<std::tuple<std::string, Edit, std::string>> cases = {
      {"model", [](testing::GgufTestWriter& g) { g.kvs.erase(g.kvs.begin() + 1); },
       "general.type is '', not 'adapter'"},
      {"qwen2",
       [](testing::GgufTestWriter& g) {
         g.kvs.erase(g.kvs.begin());
         g.kv_string("general.architecture", "qwen2");
       },
       "an adapter for a 'qwen2' model; the base is a llama model"},
      {"alora", [](testing::GgufTestWriter& g) { g.kv_i32s("adapter.alora.invocation_tokens", {5, 6}); },
       "adapter.alora.invocation_tokens: activated LoRA"},
      {"unpaired", drop("blk.0.attn_v.weight.lora_b"), "'blk.0.attn_v.weight.lora_a' has no lora_b to pair with"},
      {"embedding",
       [](testing::GgufTestWriter& g) {
         g.tensor("token_embd.weight.lora_a", {8, 64}, GgmlType::kF32);
       },
       "'token_embd.weight.lora_a' adapts the token embedding"},
      // Factors that do not fit the layer (llama.cpp's converter writes GPT-2's Conv1D
      // adapters so, and llama.cpp refuses them), named as the file names them.
      {"inputs", reshape("blk.0.attn_q.weight.lora_a", {32, 8}),
       "tensor 'blk.0.attn_q.weight.lora_a' has ggml shape [32, 8], but 'blk.0.attn_q.weight' of the base takes 128 "
       "inputs"},
      {"outputs", reshape("blk.1.ffn_down.weight.lora_b", {8, 32}),
       "tensor 'blk.1.ffn_down.weight.lora_b' has ggml shape [8, 32], but 'blk.1.ffn_down.weight' of the base gives "
       "128 outputs"},
  };
  // The adapter given as the model is named as what it is.
  const std::string adapter = gguf_adapter_from_peft(peft, w.dir + "/adapter.gguf", heads, kv_heads);
  const testing::CommandResult as_model = testing::run_command(testing::bin_dir() + "/tessera-generate --model '" +
                                                               adapter + "' --prompt-ids 1,2,3 --max-new-tokens 1");
  EXPECT_NE(as_model.exit_code, 0);
  EXPECT_NE(as_model.err.find(adapter + ": a LoRA adapter (general.type adapter), not a model"), std::string::npos)
      << as_model.err;
  for (const auto& [name, edit, want] : cases) {
    const std::string path = gguf_adapter_from_peft(peft, w.dir + "/" + name + ".gguf", heads, kv_heads, edit);
    const testing::CommandResult r =
        testing::run_command(testing::bin_dir() + "/tessera-generate --model '" + folder + "' --prompt-ids 1,2,3 " +
                             "--max-new-tokens 1 --lora a='" + path + "' --prompt-lora a");
    EXPECT_NE(r.exit_code, 0) << name;
    EXPECT_NE(r.err.find(path + ": "), std::string::npos) << name << ": " << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << name << ": " << r.err;
  }
}

}  // namespace
}  // namespace tessera
