// Every fixture model through the real tessera-generate program, as a user runs it: the
// reference goldens' prompts in one file, greedy ids from stdout and logits from
// --dump-logits, compared with the goldens (tokens exact, logits within the fixtures
// README's f32 tolerance of 1e-3). Fused and plain paths, all prompts batched and one at a
// time (--max-num-seqs 1), and through worker processes at every tensor-parallel size the
// model's shapes allow among 2 and 3 (--tensor-parallel N). The PyTorch checkpoints of
// torch-checkpoints/ (fixtures README section 6: .bin shards, the legacy format, a DeepSpeed
// checkpoint JSON) go the same way, folder or JSON, at TP 1 and 2, fused and plain. With a
// weights budget of 25% (--weights-budget: at TP 1 the other layers mapped from the checkpoint
// file as stored where they lie there as the kernels read them, else from a spill file,
// --weights-streaming map; at TP 2 from a cache file, --weights-cache-dir, written by a first
// run and read back by a second) every golden model gives the goldens too.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tests/test_support.h"
#include "tests/tools/golden_prompts.h"
#include "tests/tools/serve_process.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;


struct FixtureRun {
  std::string model;
  int world = 1;
  bool inject = true;
  bool one_at_a_time = false;
  bool streamed = false;  // --weights-budget 25%
  // The ranks in mount namespaces of their own, sharing no /dev/shm as on different hosts:
  // worker.collectives auto finds that and reduces over Gloo (TCP).
  bool gloo = false;
};

std::string run_name(const ::testing::TestParamInfo<FixtureRun>& info) {
  std::string m = info.param.model;
  for (char& ch : m) if (ch == '-' || ch == '/' || ch == '.') ch = '_';
  return m + "_tp" + std::to_string(info.param.world) + (info.param.inject ? "_fused" : "_plain") +
         (info.param.one_at_a_time ? "_single" : "_batched") + (info.param.streamed ? "_streamed" : "") +
         (info.param.gloo ? "_gloo" : "");
}

// The folder holding a model's config.json and goldens/: the model itself, or the folder of
// a DeepSpeed checkpoint JSON.
std::string model_folder(const std::string& model) {
  return model.size() > 5 && model.compare(model.size() - 5, 5, ".json") == 0 ? fs::path(model).parent_path().string()
                                                                                : model;
}

// torch-checkpoints/<case> for every case folder with goldens, and each DeepSpeed
// checkpoint JSON in it; the cases known when this was written are listed even without
// the fixtures, so that their tests skip visibly.
std::vector<std::string> torch_checkpoint_models() {
  const std::string root = testing::fixtures_dir() + "/torch-checkpoints";
  if (testing::fixtures_dir().empty() || !fs::is_directory(root)) {
    return {"torch-checkpoints/bloom-bin-sharded", "torch-checkpoints/bloom-bin-sharded/ds_inference.json",
            "torch-checkpoints/llama-bin-legacy"};
  }
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!fs::exists(e.path() / "goldens" / "index.json")) continue;
    const std::string name = "torch-checkpoints/" + e.path().filename().string();
    out.push_back(name);
    for (const auto& f : fs::directory_iterator(e.path())) {
      const std::string file = f.path().filename().string();
      if (f.path().extension() != ".json" || file == "config.json" || file.find(".index.json") != std::string::npos) continue;
      std::ifstream in(f.path());
      const auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_object() && j.contains("checkpoints")) out.push_back(name + "/" + file);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether the model's shapes allow `world` ranks (heads and MLP widths divide).
bool tp_allowed(const std::string& model, int world) {
  const std::string dir = testing::fixtures_dir();
  if (dir.empty()) return world == 2;  // listed, so that the test skips visibly
  std::ifstream in(dir + "/" + model_folder(model) + "/config.json");
  if (!in) return false;
  auto config = parse_model_config(nlohmann::json::parse(in), model);
  return config.is_ok() && ShardSpec::make(config.value(), 0, world).is_ok();
}

std::vector<FixtureRun> runs() {
  std::vector<FixtureRun> out;
  for (const std::string& m : testing::golden_models()) {
    for (bool inject : {true, false}) {
      out.push_back({m, 1, inject, false});
      out.push_back({m, 1, inject, true});
    }
    for (int world : {2, 3}) {
      if (tp_allowed(m, world)) out.push_back({m, world, true, false});
    }
    out.push_back({m, 1, true, false, true});
    if (tp_allowed(m, 2)) out.push_back({m, 2, true, false, true});
    // Ranks apart, over Gloo as across hosts (on loopback): fused and plain.
    for (int world : {2, 3}) {
      if (!tp_allowed(m, world)) continue;
      out.push_back({m, world, true, false, false, true});
      out.push_back({m, world, false, false, false, true});
    }
  }
  for (const std::string& m : torch_checkpoint_models()) {
    for (bool inject : {true, false}) {
      out.push_back({m, 1, inject, false});
      if (tp_allowed(m, 2)) out.push_back({m, 2, inject, false});
    }
  }
  return out;
}

class GenerateFixturesTest : public ::testing::TestWithParam<FixtureRun> {};

// The sanitizer pass (CI's second build, about 5x slower) looks for memory errors and
// undefined behaviour, not for different numbers: every family runs its plain path one
// sequence at a time and its fused path batched across ranks, which between them reach
// every kernel, the batching and the tensor-parallel code. The other one-rank variants
// re-run that code on the same shapes, and kjv-llama (the largest fixture, a plain Llama
// that tiny-llama already covers) runs only across ranks; the release build runs them all.
bool run_under_sanitizers(const FixtureRun& p) {
  // Streaming is the same code for every model: one model across ranks reaches it; Gloo too.
  if (p.streamed || p.gloo) return p.model == "tiny-llama" && p.world == 2 && p.inject;
  if (p.model == "kjv-llama") return p.world > 1;
  return p.world > 1 || (!p.inject && p.one_at_a_time);
}

std::vector<FixtureRun> runs_for_this_build() {
  std::vector<FixtureRun> all = runs();
  if (testing::kSanitizedBuild) std::erase_if(all, [](const FixtureRun& p) { return !run_under_sanitizers(p); });
  return all;
}

TEST_P(GenerateFixturesTest, GreedyIdsAndLogitsMatchTheGoldens) {
  TESSERA_REQUIRE_FIXTURES();
  const FixtureRun& p = GetParam();
  const std::string model = testing::fixtures_dir() + "/" + p.model;
  const std::string goldens = testing::fixtures_dir() + "/" + model_folder(p.model) + "/goldens";
  if (!fs::exists(goldens + "/index.json")) GTEST_SKIP() << "SKIPPED: " << goldens << " not found";
  std::ifstream in(goldens + "/index.json");
  const auto index = nlohmann::json::parse(in);
  const auto& cases = index["cases"];
  const int n_new = static_cast<int>(cases[0]["greedy_ids"].size());
  const std::string dir = testing::make_temp_dir("tessera-gen-fixtures");
  testing::write_golden_prompts(cases, dir + "/prompts.txt");
  std::string programs = testing::bin_dir();
  if (p.gloo) {
    std::string why_not;
    programs = testing::ranks_apart_bin_dir("tessera-generate", &why_not);
    if (programs.empty()) GTEST_SKIP() << "SKIPPED: " << why_not;
  }
  // Streamed across ranks: through a cache file of streamed weights, twice: the first run
  // writes it, the second reads the streamed layers back from it instead of the checkpoint.
  const bool cached = p.streamed && p.world > 1;
  std::string cmd = std::string(p.gloo || p.streamed ? "TESSERA_LOG_LEVEL=info " : "") + programs +
                    "/tessera-generate --model " + testing::shell_quote(model) + " --prompt-ids-file " +
                    testing::shell_quote(dir + "/prompts.txt") + " --max-new-tokens " + std::to_string(n_new) +
                    " --json --dump-logits " + testing::shell_quote(dir + "/logits.f32");
  if (!p.inject) cmd += " --no-kernel-inject";
  if (p.one_at_a_time) cmd += " --max-num-seqs 1";
  if (p.world > 1) cmd += " --tensor-parallel " + std::to_string(p.world);
  if (p.streamed) {
    // (At TP 1 no folder is named: one would take the streamed weights instead of the checkpoint.)
    cmd += " --weights-budget 25% " +
           (cached ? "--weights-cache-dir " + testing::shell_quote(dir) : std::string("--weights-streaming map"));
  }
  float worst = 0;
  for (int pass = 0; pass < (cached ? 2 : 1); ++pass) {
    const auto r = testing::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
    if (p.gloo) {
      for (int rank = 0; rank < p.world; ++rank) {
        const std::string chosen = "rank " + std::to_string(rank) + "/" + std::to_string(p.world) +
                                   ": collectives over gloo (the ranks do not share one /dev/shm)";
        EXPECT_NE(r.err.find(chosen), std::string::npos) << "auto did not pick Gloo for ranks apart:\n" << r.err;
      }
    }
    if (cached) {
      const std::string how = pass == 0 ? "(written now)" : "(read back)";
      for (int rank = 0; rank < p.world; ++rank) {
        const std::string file = "-rank" + std::to_string(rank) + "of" + std::to_string(p.world) + ".tessera-weights " + how;
        EXPECT_NE(r.err.find(file), std::string::npos) << "pass " << pass << ", rank " << rank << ":\n" << r.err;
      }
    }
    // At TP 1 the checkpoint (f32) holds its matrices as the kernels read them: every streamed
    // unit is mapped from it as stored, none written to the spill file; except where the load
    // converts matrices (BLOOM's and GPT-NeoX's fused QKV regrouped, GPT-2's Conv1D transposed).
    const bool converted = p.model == "tiny-bloom" || p.model == "tiny-gpt-neox" || p.model == "tiny-gpt2";
    if (p.streamed && !cached && p.world == 1 && !converted) {
      EXPECT_NE(r.err.find("model.safetensors (as stored)"), std::string::npos) << r.err;
    }
    const std::vector<float> got = testing::read_f32_file(dir + "/logits.f32");
    std::stringstream out(r.out);
    std::string line;
    size_t offset = 0;
    for (const auto& c : cases) {
      ASSERT_TRUE(std::getline(out, line)) << r.out;
      EXPECT_EQ(nlohmann::json::parse(line)["output_ids"], c["greedy_ids"]) << c["name"] << " (pass " << pass << ")";
      const std::vector<float> want = testing::read_f32_file(goldens + "/" + c["logits_file"].get<std::string>());
      ASSERT_LE(offset + want.size(), got.size()) << "dumped logits end early";
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[offset + i] - want[i]));
      offset += want.size();
    }
    EXPECT_EQ(offset, got.size()) << "dumped logits hold more rows than the cases";
  }
  fs::remove_all(dir);
  EXPECT_LE(worst, 1e-3f);
  std::cout << "[ REPORT   ] tessera-generate " << p.model << " TP=" << p.world << (p.inject ? " fused" : " plain")
            << (p.one_at_a_time ? " one at a time" : " batched")
            << (p.streamed ? (p.world > 1 ? ", 25% of weights resident, through a cache file written then read back"
                                          : ", 25% of weights resident, mapped")
                           : "")
            << (p.gloo ? ", ranks apart (each its own /dev/shm), over Gloo" : "")
            << ": max |logit - reference| = " << worst
            << std::endl;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateFixturesTest, ::testing::ValuesIn(runs_for_this_build()), run_name);

// Speculative decoding through the real program and, across ranks, through worker processes
// (proposals on the wire, each rank verifying and rewinding alike): the greedy ids stay the
// goldens'. Every golden model batched at TP 1, and at TP 2 where its shapes allow.
class GenerateSpeculativeTest : public ::testing::TestWithParam<FixtureRun> {};

std::vector<FixtureRun> speculative_runs() {
  std::vector<FixtureRun> out;
  for (const std::string& m : testing::golden_models()) {
    // TP 1 on the plain op sequence, TP 2 on the fused kernels.
    if (!testing::kSanitizedBuild) out.push_back({m, 1, false, false});
    if (tp_allowed(m, 2)) out.push_back({m, 2, true, false});
  }
  return out;
}

// Runs the model's golden prompts batched with `flags` and checks every greedy id.
void expect_goldens_with(const FixtureRun& p, const std::string& flags) {
  const std::string model = testing::fixtures_dir() + "/" + p.model;
  std::ifstream in(model + "/goldens/index.json");
  const auto index = nlohmann::json::parse(in);
  const auto& cases = index["cases"];
  const std::string dir = testing::make_temp_dir("tessera-gen-spec");
  testing::write_golden_prompts(cases, dir + "/prompts.txt");
  const std::string cmd = testing::bin_dir() + "/tessera-generate --model " + testing::shell_quote(model) +
                          " --prompt-ids-file " + testing::shell_quote(dir + "/prompts.txt") + " --max-new-tokens " +
                          std::to_string(cases[0]["greedy_ids"].size()) + " --json " + flags +
                          " --block-size 4 --max-num-batched-tokens 16 --tensor-parallel " + std::to_string(p.world) +
                          (p.inject ? "" : " --no-kernel-inject");
  const auto r = testing::run_command(cmd);
  fs::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
  std::stringstream out(r.out);
  std::string line;
  for (const auto& c : cases) {
    ASSERT_TRUE(std::getline(out, line)) << r.out;
    EXPECT_EQ(nlohmann::json::parse(line)["output_ids"], c["greedy_ids"]) << c["name"] << " (" << flags << ")";
  }
}

// The sanitizer pass looks for memory errors: proposing, verifying and rewinding are the same
// code for every family, and the family's kernels are GenerateFixturesTest's. So there every
// other golden model runs n-gram proposals and the rest a draft model (kjv-llama, with its own
// trained draft, runs both); the release build runs both on every model.
bool speculates_under_sanitizers(const std::string& model, bool ngram) {
  if (model == "kjv-llama") return true;
  const std::vector<std::string> models = testing::golden_models();
  const auto at = std::find(models.begin(), models.end(), model) - models.begin();
  return (at % 2 == 0) == ngram;
}

TEST_P(GenerateSpeculativeTest, NgramProposalsKeepTheGreedyIds) {
  TESSERA_REQUIRE_FIXTURES();
  if (testing::kSanitizedBuild && !speculates_under_sanitizers(GetParam().model, true))
    GTEST_SKIP() << "the sanitized build runs a draft model on this one (n-gram on every other model)";
  expect_goldens_with(GetParam(), "--speculative ngram --speculative-tokens 5");
}

// A draft model in the same processes (each rank runs it, split like the target or whole):
// the model itself, and for kjv-llama its trained draft fixture; fused and plain kernels.
TEST_P(GenerateSpeculativeTest, DraftModelProposalsKeepTheGreedyIds) {
  TESSERA_REQUIRE_FIXTURES();
  const FixtureRun& p = GetParam();
  if (testing::kSanitizedBuild && !speculates_under_sanitizers(p.model, false))
    GTEST_SKIP() << "the sanitized build runs n-gram proposals on this one (a draft model on every other model)";
  const std::string draft = p.model == "kjv-llama" ? "kjv-llama-draft" : p.model;
  expect_goldens_with(p, "--speculative draft --speculative-tokens 4 --draft-model " +
                             testing::shell_quote(testing::fixtures_dir() + "/" + draft));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateSpeculativeTest, ::testing::ValuesIn(speculative_runs()), run_name);

TEST(GenerateSpeculativeFlags, BadValuesAreRefusedNamingTheFlag) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string gen = testing::bin_dir() + "/tessera-generate --model " +
                          testing::shell_quote(testing::fixtures_dir() + "/tiny-llama") + " --prompt-ids 1,2,3";
  auto r = testing::run_command(gen + " --speculative eagle");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--speculative: expected none, ngram or draft, got 'eagle'"), std::string::npos) << r.err;
  r = testing::run_command(gen + " --speculative draft");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--speculative draft needs --draft-model PATH"), std::string::npos) << r.err;
  r = testing::run_command(gen + " --speculative ngram --draft-model /nowhere");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--draft-model is given, but --speculative is ngram"), std::string::npos) << r.err;
  r = testing::run_command(gen + " --speculative draft --draft-model /nowhere/draft");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("speculative.draft_model /nowhere/draft"), std::string::npos) << r.err;
  // A draft of another vocabulary: both sizes named.
  r = testing::run_command(gen + " --speculative draft --draft-model " +
                           testing::shell_quote(testing::fixtures_dir() + "/kjv-llama"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("a draft must share the target's vocabulary"), std::string::npos) << r.err;
  r = testing::run_command(gen + " --speculative ngram --speculative-tokens 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--speculative-tokens: expected 1 to 16, got 0"), std::string::npos) << r.err;
  r = testing::run_command(gen + " --speculative ngram --dump-logits /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--dump-logits needs --speculative none"), std::string::npos) << r.err;
}

// DeepSpeed's keep list applies to the new families as to the first ones: Falcon's MLP
// output kept whole on both ranks (so its input is too) still gives the goldens.
TEST(GenerateFixturesOverrides, DeepSpeedKeepListOnFalconStillMatches) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-falcon";
  std::ifstream in(model + "/goldens/index.json");
  const auto index = nlohmann::json::parse(in);
  const auto& c = index["cases"][3];
  std::string ids;
  for (const auto& id : c["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const auto r = testing::run_command("DS_KEEP_LINEAR_ITEMS=\"{'dense_4h_to_h':'falcon'}\" " + testing::bin_dir() +
                                      "/tessera-generate --model " + testing::shell_quote(model) + " --prompt-ids " + ids +
                                      " --max-new-tokens 24 --json --tensor-parallel 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"], c["greedy_ids"]);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// worker.collectives: auto on one host finds one /dev/shm and uses shared memory; nccl for
// CPU ranks and an unknown name are refused by name.
TEST(GenerateCollectives, AutoOnOneHostUsesSharedMemoryAndBadChoicesAreNamed) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string base = "TESSERA_LOG_LEVEL=info " + testing::bin_dir() + "/tessera-generate --model " +
                           testing::shell_quote(testing::fixtures_dir() + "/tiny-llama") +
                           " --prompt-ids 1,2,3 --max-new-tokens 2 --tensor-parallel 2";
  const auto autos = testing::run_command(base);
  ASSERT_EQ(autos.exit_code, 0) << autos.err;
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(autos.err.find("rank " + std::to_string(r) + "/2: collectives over shm (every rank sees this /dev/shm)"),
              std::string::npos)
        << autos.err;
  const auto nccl = testing::run_command(base + " --collectives nccl");
  EXPECT_NE(nccl.exit_code, 0);
  EXPECT_NE(nccl.err.find("worker.collectives nccl cannot serve CPU ranks"), std::string::npos) << nccl.err;
  const auto bogus = testing::run_command(base + " --collectives mpi");
  EXPECT_NE(bogus.exit_code, 0);
  EXPECT_NE(bogus.err.find("--collectives: \"mpi\" is not auto, shm, gloo or nccl"), std::string::npos) << bogus.err;
}

// shm asked for where the ranks share no /dev/shm (each rank in a mount namespace of its own)
// stops start-up naming the key, instead of the ranks waiting for each other until a timeout.
TEST(GenerateCollectives, ShmAcrossRanksApartIsRefusedNamingTheKey) {
  TESSERA_REQUIRE_FIXTURES();
  std::string why_not;
  const std::string programs = testing::ranks_apart_bin_dir("tessera-generate", &why_not);
  if (programs.empty()) GTEST_SKIP() << "SKIPPED: " << why_not;
  const auto r = testing::run_command(programs + "/tessera-generate --model " +
                                      testing::shell_quote(testing::fixtures_dir() + "/tiny-llama") +
                                      " --prompt-ids 1,2,3 --max-new-tokens 2 --tensor-parallel 2 --collectives shm");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("worker.collectives shm: the ranks do not share one /dev/shm"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
