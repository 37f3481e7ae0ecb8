// tessera-perplexity against the fixture's reference (../shared/fixtures/README.md section 10):
// a real process on kjv-llama's held-out chapters must reproduce perplexity.json in f32 —
// tokens scored equal, total NLL within 1e-4 relative — in one process and through two
// worker processes; int8 weights must stay within 1% of the f32 mean NLL. Plus the chunking
// rule itself and the tool's errors (these need no fixtures).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"
#include "coordinator/engine/perplexity_chunks.h"

namespace tessera {
namespace {

using testing::run_command;

struct PerplexityRun {
  int exit_code = -1;
  std::string err;
  nlohmann::json result;  // the --json line
};

PerplexityRun run_perplexity(const std::string& model, const std::string& text, const std::string& extra) {
  auto r = run_command(testing::bin_dir() + "/tessera-perplexity --model " + testing::shell_quote(model) +
                       " --text-file " + testing::shell_quote(text) + " --json " + extra);
  PerplexityRun out;
  out.exit_code = r.exit_code;
  out.err = r.err;
  if (r.exit_code == 0) {
    std::string s = r.out.substr(0, r.out.size() - 1);
    out.result = nlohmann::json::parse(s.substr(s.rfind('\n') + 1));
  }
  return out;
}

class KjvPerplexityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    dir_ = testing::fixtures_dir() + "/kjv-llama";
    std::ifstream in(dir_ + "/perplexity.json");
    if (!in) GTEST_SKIP() << "SKIPPED: " << dir_ << "/perplexity.json not found";
    reference_ = nlohmann::json::parse(in);
  }
  void expect_reference(const PerplexityRun& r) {
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.result["tokens_scored"], reference_["tokens_scored"]);
    const double total = r.result["total_nll"], ref = reference_["total_nll_nats"];
    EXPECT_LE(std::fabs(total - ref) / ref, 1e-4) << "total NLL " << total << " vs " << ref;
    EXPECT_NEAR(r.result["perplexity"].get<double>(), std::exp(total / r.result["tokens_scored"].get<double>()), 1e-9);
  }
  std::string dir_;
  nlohmann::json reference_;
};

TEST_F(KjvPerplexityTest, Float32ReproducesTheReference) {
  expect_reference(run_perplexity(dir_, dir_ + "/heldout.txt", "--dtype float32"));
}

// The sanitized build scores the held-out text once (float32 above, 15 s there): the
// tensor-parallel and int8 runs repeat that scoring loop over other kernels, which the
// sanitized golden runs across ranks and the int8 tests already reach at 1/20 of the cost.
constexpr char kFloat32CoversScoring[] =
    "SKIPPED: sanitized build; the float32 run covers the scoring loop (the release build runs this one)";

TEST_F(KjvPerplexityTest, TensorParallelTwoReproducesTheReference) {
  if (testing::kSanitizedBuild) GTEST_SKIP() << kFloat32CoversScoring;
  expect_reference(run_perplexity(dir_, dir_ + "/heldout.txt", "--dtype float32 --tensor-parallel 2"));
}

TEST_F(KjvPerplexityTest, Int8StaysWithinOnePercentOfFloat32) {
  if (testing::kSanitizedBuild) GTEST_SKIP() << kFloat32CoversScoring;
  const double ref = reference_["mean_nll_nats"];
  for (const char* group : {"32", "64"}) {  // kjv-llama's hidden size 192 allows 32, 64, 96, 192
    auto r = run_perplexity(dir_, dir_ + "/heldout.txt", std::string("--quantize int8 --quantize-group ") + group);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.result["tokens_scored"], reference_["tokens_scored"]);
    const double mean = r.result["mean_nll"];
    EXPECT_LE(std::fabs(mean - ref) / ref, 0.01) << "group " << group << ": mean NLL " << mean << " vs " << ref;
    std::cout << "int8 group " << group << ": mean NLL " << mean << " (f32 reference " << ref << ")\n";
  }
}

// 4-bit weights (q4_0's rule, a scale per 32 inputs) within 2% of f32, and, at twice the
// quantization error of int8, no closer than int8's group 32 (a check that int4 really ran).
TEST_F(KjvPerplexityTest, Int4StaysWithinTwoPercentOfFloat32) {
  if (testing::kSanitizedBuild) GTEST_SKIP() << kFloat32CoversScoring;
  const double ref = reference_["mean_nll_nats"];
  auto int4 = run_perplexity(dir_, dir_ + "/heldout.txt", "--quantize int4");
  auto int8 = run_perplexity(dir_, dir_ + "/heldout.txt", "--quantize int8 --quantize-group 32");
  ASSERT_EQ(int4.exit_code, 0) << int4.err;
  ASSERT_EQ(int8.exit_code, 0) << int8.err;
  EXPECT_EQ(int4.result["tokens_scored"], reference_["tokens_scored"]);
  const double mean4 = int4.result["mean_nll"], mean8 = int8.result["mean_nll"];
  EXPECT_LE(std::fabs(mean4 - ref) / ref, 0.02) << "int4: mean NLL " << mean4 << " vs " << ref;
  EXPECT_GT(std::fabs(mean4 - ref), std::fabs(mean8 - ref)) << "int4 " << mean4 << " int8 " << mean8 << " f32 " << ref;
  std::cout << "int4: mean NLL " << mean4 << ", int8 group 32 " << mean8 << " (f32 reference " << ref << ")\n";
}

TEST(PerplexityChunksTest, ConsecutiveChunksShareOneTokenAndEveryTokenButTheFirstIsScoredOnce) {
  std::vector<int32_t> doc(1200);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>(i);
  std::vector<PerplexityChunk> chunks;
  append_perplexity_chunks(doc, 3, 512, &chunks);
  ASSERT_EQ(chunks.size(), 3u);  // starts 0, 511, 1022
  EXPECT_EQ(chunks[0].tokens.size(), 512u);
  EXPECT_EQ(chunks[1].tokens.front(), 511);
  EXPECT_EQ(chunks[2].tokens.front(), 1022);
  EXPECT_EQ(chunks[2].tokens.back(), 1199);
  size_t scored = 0;
  for (const auto& c : chunks) {
    EXPECT_EQ(c.document, 3);
    scored += c.tokens.size() - 1;
  }
  EXPECT_EQ(scored, doc.size() - 1);
  // A document of exactly one chunk plus one token makes a second chunk of two tokens; one of
  // a single token scores nothing.
  chunks.clear();
  append_perplexity_chunks(std::vector<int32_t>(513, 7), 0, 512, &chunks);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].tokens.size(), 2u);
  chunks.clear();
  append_perplexity_chunks({1}, 0, 512, &chunks);
  EXPECT_TRUE(chunks.empty());
}

TEST(PerplexityCliTest, BadInputsAreOneLineErrors) {
  const std::string dir = testing::make_temp_dir("tessera-ppl-cli");
  const std::string model = dir + "/model";
  ASSERT_EQ(run_command(testing::bin_dir() + "/tessera-make-checkpoint --arch llama --preset tiny --out " +
                        testing::shell_quote(model))
                .exit_code,
            0);
  testing::write_file(dir + "/text.txt", "one document\n");
  auto expect_error = [&](const std::string& text, const std::string& extra, const std::string& needle) {
    auto r = run_command(testing::bin_dir() + "/tessera-perplexity --model " + testing::shell_quote(model) +
                         " --text-file " + testing::shell_quote(text) + " " + extra);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  // A generated checkpoint has no tokenizer: perplexity needs one.
  expect_error(dir + "/text.txt", "", "tokenizer");
  expect_error(dir + "/missing.txt", "", "tokenizer");
  if (!testing::fixtures_dir().empty()) {
    const std::string kjv = testing::fixtures_dir() + "/kjv-llama";
    auto run_kjv = [&](const std::string& text, const std::string& extra, const std::string& needle) {
      auto r = run_command(testing::bin_dir() + "/tessera-perplexity --model " + testing::shell_quote(kjv) +
                           " --text-file " + testing::shell_quote(text) + " " + extra);
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    };
    run_kjv(dir + "/missing.txt", "", "--text-file: no such file");
    run_kjv(dir + "/text.txt", "--context 1", "--context must be at least 2");
    run_kjv(dir + "/text.txt", "--context 600", "exceeds the model's context of 512");
    run_kjv(dir + "/text.txt", "--dtype float64", "--dtype: unsupported");
    run_kjv(dir + "/text.txt", "--quantize int8 --quantize-group 128", "does not divide the input dimension 192");
    testing::write_file(dir + "/empty.txt", "\n\n");
    run_kjv(dir + "/empty.txt", "", "holds no text");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
