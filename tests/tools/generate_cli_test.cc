// tessera-generate as a user runs it: a real process, its stdout JSON, its exit code and
// its one-line errors for every kind of bad input.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/test_support.h"
#include "tests/tools/golden_prompts.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

std::string generate_bin() { return testing::bin_dir() + "/tessera-generate"; }


// Rewrites a safetensors file's JSON header with `edit` applied, keeping the data bytes.
template <typename Edit>
void edit_safetensors_header(const std::string& path, Edit edit) {
  std::string bytes = testing::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  uint64_t hn = h.size();
  testing::write_file(path, std::string(reinterpret_cast<const char*>(&hn), 8) + h + bytes.substr(8 + n));
}

// A small random-weight Llama made by our own generator, so these tests need no fixtures.
class GenerateCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("tessera-gen-cli");
    model_ = dir_ + "/model";
    auto r = run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --preset tiny --out " +
                         testing::shell_quote(model_) + " --seed 7");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Copies the model to a fresh folder for one test to break.
  std::string copy_model(const std::string& name) {
    std::string dst = dir_ + "/" + name;
    fs::copy(model_, dst, fs::copy_options::recursive);
    return dst;
  }

  testing::CommandResult generate(const std::string& model, const std::string& extra) {
    return run_command(generate_bin() + " --model " + testing::shell_quote(model) + " " + extra);
  }

  // The contract for bad input: non-zero exit, nothing on stdout, one line on stderr that
  // mentions `needle`.
  void expect_clean_error(const testing::CommandResult& r, const std::string& needle) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  }

  nlohmann::json read_config(const std::string& model) {
    std::ifstream in(model + "/config.json");
    return nlohmann::json::parse(in);
  }
  void write_config(const std::string& model, const nlohmann::json& j) {
    std::ofstream(model + "/config.json") << j.dump(2);
  }

  std::string dir_, model_;
};

TEST_F(GenerateCliTest, PrintsOneJsonObjectWithPromptAndOutputIds) {
  auto r = generate(model_, "--prompt-ids 1,5,9 --max-new-tokens 6 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({1, 5, 9}));
  ASSERT_EQ(j["output_ids"].size(), 6u);
  EXPECT_FALSE(j.contains("text")) << "no tokenizer in a generated checkpoint";
}

TEST_F(GenerateCliTest, FusedAndPlainPathsGiveTheSameTokens) {
  auto fused = generate(model_, "--prompt-ids 3,4,5,6,7 --max-new-tokens 12 --json");
  auto plain = generate(model_, "--prompt-ids 3,4,5,6,7 --max-new-tokens 12 --json --no-kernel-inject");
  ASSERT_EQ(fused.exit_code, 0) << fused.err;
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(fused.out)["output_ids"], nlohmann::json::parse(plain.out)["output_ids"]);
}

TEST_F(GenerateCliTest, DumpLogitsWritesOneVocabRowPerGeneratedToken) {
  const std::string path = dir_ + "/logits.f32";
  auto r = generate(model_, "--prompt-ids 2,3 --max-new-tokens 5 --json --dump-logits " + testing::shell_quote(path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const int64_t vocab = read_config(model_)["vocab_size"];
  std::vector<float> logits = testing::read_f32_file(path);
  ASSERT_EQ(static_cast<int64_t>(logits.size()), 5 * vocab);
  // Greedy: each output id is the argmax of its row.
  auto out = nlohmann::json::parse(r.out)["output_ids"];
  for (int s = 0; s < 5; ++s) {
    const float* row = logits.data() + s * vocab;
    EXPECT_EQ(std::max_element(row, row + vocab) - row, out[s].get<int64_t>());
  }
}

TEST_F(GenerateCliTest, MissingConfigJson) {
  std::string m = copy_model("no-config");
  fs::remove(m + "/config.json");
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "config.json");
}

TEST_F(GenerateCliTest, MissingSafetensors) {
  std::string m = copy_model("no-weights");
  fs::remove(m + "/model.safetensors");
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "safetensors");
}

TEST_F(GenerateCliTest, TruncatedSafetensors) {
  std::string m = copy_model("truncated");
  fs::resize_file(m + "/model.safetensors", fs::file_size(m + "/model.safetensors") / 2);
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "model.safetensors");
}

TEST_F(GenerateCliTest, HeaderThatLiesAboutOffsets) {
  std::string m = copy_model("lying-header");
  edit_safetensors_header(m + "/model.safetensors", [](nlohmann::json& header) {
    // Point the first tensor's data far past the end of the file, keeping its length.
    for (auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      const int64_t len = info["data_offsets"][1].get<int64_t>() - info["data_offsets"][0].get<int64_t>();
      info["data_offsets"] = {int64_t{1} << 40, (int64_t{1} << 40) + len};
      break;
    }
  });
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "model.safetensors");
}

TEST_F(GenerateCliTest, TensorShapeDisagreesWithConfig) {
  std::string m = copy_model("wrong-shape");
  auto cfg = read_config(m);
  cfg["intermediate_size"] = cfg["intermediate_size"].get<int>() + 8;
  write_config(m, cfg);
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "mlp.gate_proj.weight");
}

TEST_F(GenerateCliTest, UnknownModelType) {
  std::string m = copy_model("unknown-type");
  auto cfg = read_config(m);
  cfg["model_type"] = "mamba";
  write_config(m, cfg);
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "unknown model_type \"mamba\"");
}

TEST_F(GenerateCliTest, UnsupportedDtypeFlag) {
  expect_clean_error(generate(model_, "--prompt-ids 1,2 --dtype int8"), "int8");
}

TEST_F(GenerateCliTest, UnsupportedDtypeInCheckpoint) {
  std::string m = copy_model("f64");
  edit_safetensors_header(m + "/model.safetensors", [](nlohmann::json& header) {
    // Relabel the final norm (f32 values) as F64 with half as many elements: same bytes.
    auto& norm = header["model.norm.weight"];
    norm["dtype"] = "F64";
    norm["shape"] = {norm["shape"][0].get<int64_t>() / 2};
  });
  expect_clean_error(generate(m, "--prompt-ids 1,2"), "F64");
}

TEST_F(GenerateCliTest, PromptIdOutOfVocabulary) {
  const int64_t vocab = read_config(model_)["vocab_size"];
  expect_clean_error(generate(model_, "--prompt-ids 1," + std::to_string(vocab)), std::to_string(vocab));
  expect_clean_error(generate(model_, "--prompt-ids 1,-3"), "-3");
  expect_clean_error(generate(model_, "--prompt-ids 1,x"), "\"x\"");
}

TEST_F(GenerateCliTest, DeepSpeedCheckpointJson) {
  const std::string ds = dir_ + "/ds.json";
  std::ofstream(ds) << nlohmann::json{{"type", "ds_model"}, {"checkpoints", {"model/model.safetensors"}},
                                      {"version", 1.0}}
                           .dump();
  // config.json is looked up beside the JSON (no base_dir): put it there.
  fs::copy_file(model_ + "/config.json", dir_ + "/config.json");
  auto direct = generate(model_, "--prompt-ids 1,2,3 --max-new-tokens 4 --json");
  auto via_json = generate(ds, "--prompt-ids 1,2,3 --max-new-tokens 4 --json");
  ASSERT_EQ(via_json.exit_code, 0) << via_json.err;
  EXPECT_EQ(nlohmann::json::parse(direct.out)["output_ids"], nlohmann::json::parse(via_json.out)["output_ids"]);

  const std::string missing = dir_ + "/missing.json";
  std::ofstream(missing) << R"({"type": "BLOOM-176B", "checkpoints": ["nowhere.safetensors"], "version": 1.0})";
  expect_clean_error(generate(missing, "--prompt-ids 1,2"), "nowhere.safetensors");
}

TEST_F(GenerateCliTest, NeitherOrBothPromptFlags) {
  expect_clean_error(generate(model_, "--max-new-tokens 2"), "--prompt");
  expect_clean_error(generate(model_, "--prompt hi --prompt-ids 1"), "--prompt");
}

// Against the reference goldens, through the real program.
TEST(GenerateCliFixtures, GreedyIdsAndDumpedLogitsMatchTheReference) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  std::ifstream in(model + "/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  const auto& c = index["cases"][2];
  std::string ids;
  for (const auto& id : c["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const std::string dir = testing::make_temp_dir("tessera-dump");
  const std::string dump = dir + "/l.f32";
  auto r = run_command(generate_bin() + " --model " + testing::shell_quote(model) + " --prompt-ids " + ids +
                       " --max-new-tokens 24 --json --dump-logits " + testing::shell_quote(dump));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"], c["greedy_ids"]);
  auto got = testing::read_f32_file(dump);
  auto want = testing::read_f32_file(model + "/goldens/" + c["logits_file"].get<std::string>());
  fs::remove_all(dir);
  ASSERT_EQ(got.size(), want.size());
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, 1e-3f);
}

TEST(GenerateCliFixtures, KjvLlamaTextPromptReproducesTheGoldenContinuation) {
  TESSERA_REQUIRE_FIXTURES();
  // The bundled default model is the fixture's kjv-llama.
  const std::string model = testing::source_dir() + "/models/kjv-llama";
  std::ifstream in(testing::fixtures_dir() + "/kjv-llama/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  for (const auto& c : index["cases"]) {
    if (c["prompt_text"].get<std::string>().empty()) continue;  // the bare-<s> case
    const int n = static_cast<int>(c["greedy_ids"].size());
    auto r = run_command(generate_bin() + " --model " + testing::shell_quote(model) + " --prompt " +
                         testing::shell_quote(c["prompt_text"].get<std::string>()) + " --max-new-tokens " + std::to_string(n) +
                         " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prompt_ids"], c["prompt_ids"]) << c["label"];
    EXPECT_EQ(j["output_ids"], c["greedy_ids"]) << c["label"];
    EXPECT_EQ(j["text"], c["greedy_text"]) << c["label"];
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The contract's multi-prompt mode: every line submitted together, one JSON line per input
// line in input order, and a tiny KV pool and token budget (forcing preemption and chunked
// prefill) change nothing.
TEST(GenerateCliFixtures, PromptIdsFileRunsAllPromptsTogetherInInputOrder) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-mixtral";
  std::ifstream in(model + "/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  const std::string dir = testing::make_temp_dir("tessera-ids-file");
  std::string lines;
  for (auto it = index["cases"].rbegin(); it != index["cases"].rend(); ++it) {  // longest first
    std::string ids;
    for (const auto& id : (*it)["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
    lines += ids + "\n";
  }
  testing::write_file(dir + "/prompts.txt", lines);
  for (const std::string extra : {"", " --block-size 4 --kv-blocks 30 --max-num-batched-tokens 8 --max-num-seqs 3"}) {
    auto r = run_command(generate_bin() + " --model " + testing::shell_quote(model) + " --prompt-ids-file " +
                         testing::shell_quote(dir + "/prompts.txt") + " --max-new-tokens 24 --json" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::stringstream out(r.out);
    std::string line;
    auto it = index["cases"].rbegin();
    int n = 0;
    while (std::getline(out, line)) {
      ASSERT_NE(it, index["cases"].rend());
      auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j["prompt_ids"], (*it)["prompt_ids"]) << extra;
      EXPECT_EQ(j["output_ids"], (*it)["greedy_ids"]) << extra;
      ++it;
      ++n;
    }
    EXPECT_EQ(n, static_cast<int>(index["cases"].size()));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The design's contract: --tensor-parallel N runs the same generation through the
// coordinator/worker runtime (N tessera-worker processes, CPU ranks) and prints exactly
// what N = 1 prints — which here is the reference's greedy ids.
struct TpCase {
  const char* model;
  int world;
  const char* extra;
};

class GenerateTensorParallelTest : public ::testing::TestWithParam<TpCase> {};

TEST_P(GenerateTensorParallelTest, PrintsExactlyWhatOneRankPrints) {
  TESSERA_REQUIRE_FIXTURES();
  const TpCase& p = GetParam();
  const std::string model = testing::fixtures_dir() + "/" + p.model;
  std::ifstream in(model + "/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  const std::string dir = testing::make_temp_dir("tessera-tp-cli");
  testing::write_golden_prompts(index["cases"], dir + "/prompts.txt");
  const std::string base = generate_bin() + " --model " + testing::shell_quote(model) + " --prompt-ids-file " +
                           testing::shell_quote(dir + "/prompts.txt") + " --max-new-tokens 24 --json " + p.extra;
  auto one = run_command(base);
  auto many = run_command(base + " --tensor-parallel " + std::to_string(p.world));
  fs::remove_all(dir);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_EQ(many.out, one.out);
  std::stringstream out(many.out);
  std::string line;
  for (const auto& c : index["cases"]) {
    ASSERT_TRUE(std::getline(out, line));
    EXPECT_EQ(nlohmann::json::parse(line)["output_ids"], c["greedy_ids"]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateTensorParallelTest,
                         ::testing::Values(TpCase{"tiny-bloom", 2, ""}, TpCase{"tiny-bloom", 3, "--no-kernel-inject"},
                                           TpCase{"tiny-llama", 2, ""}, TpCase{"tiny-llama", 2, "--no-kernel-inject"},
                                           TpCase{"tiny-mixtral", 2, ""},
                                           TpCase{"tiny-mixtral", 2, "--no-kernel-inject --block-size 4 --kv-blocks 40"}),
                         [](const auto& info) {
                           std::string m = info.param.model;
                           for (char& ch : m) if (ch == '-') ch = '_';
                           return m + "_tp" + std::to_string(info.param.world) + "_" + std::to_string(info.index);
                         });

TEST(GenerateTensorParallel, DeepSpeedEnvVariableKeepsW2WholeAndStillMatches) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-mixtral";
  std::ifstream in(model + "/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  const auto& c = index["cases"][3];
  std::string ids;
  for (const auto& id : c["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  auto r = run_command("DS_KEEP_LINEAR_ITEMS=\"{'w2':'mixtral'}\" " + generate_bin() + " --model " + testing::shell_quote(model) +
                       " --prompt-ids " + ids + " --max-new-tokens 24 --json --tensor-parallel 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"], c["greedy_ids"]);
  auto bad = run_command("DS_KEEP_LINEAR_ITEMS=\"{'w2'\" " + generate_bin() + " --model " + testing::shell_quote(model) +
                         " --prompt-ids 1,2 --tensor-parallel 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("DS_KEEP_LINEAR_ITEMS"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tessera
