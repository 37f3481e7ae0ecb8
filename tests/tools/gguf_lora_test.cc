// PEFT LoRA adapters on a GGUF base (worker/lora_adapter.h), through tessera-generate as a user
// runs it: tiny-llama converted as llama.cpp's converter converts it (f32; Q and K rows
// permuted in the file, tests/worker/gguf_from_hf.h) serves an adapter written for the folder
// with the folder's logits (the same weights: within 1e-5, and at tensor-parallel 2 within
// 1e-4), while the adapter moves them; kjv-llama's 4-bit file (its q4_0 blocks as panels)
// serves an adapter of the kjv-llama folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

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
                           "' --lora-rank 8 --lora-alpha 32 --seed " + std::to_string(seed) + " 2>&1");
  EXPECT_EQ(made.exit_code, 0) << made.out;
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
  const testing::CommandResult r = testing::run_command(cmd + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out;
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

}  // namespace
}  // namespace tessera
