// GGUF files through tessera-generate alone, against llama.cpp running the very same files
// (../shared/fixtures/gguf, README section 11). Teacher-forced: every case's prompt plus the
// reference's first s greedy ids, s = 0..15, all submitted together as one batch, so that row
// s of the reference is compared with the logits Tessera computes in the same context. The
// largest difference per file is reported and bounded per type (llama.cpp multiplies
// quantized weights with activations it quantizes too, so a correct reader is close, not
// equal); the argmax must agree wherever the reference's top-1/top-2 margin exceeds twice
// that bound, and free-running greedy ids must equal the reference's up to the first row
// whose margin is not that large. Also at --tensor-parallel 2 where the heads allow it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct GgufGoldenCase {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits;  // [greedy.size(), vocab]
};

std::vector<GgufGoldenCase> gguf_goldens(const std::string& goldens_dir) {
  const nlohmann::json index = nlohmann::json::parse(testing::read_file(goldens_dir + "/index.json"));
  std::vector<GgufGoldenCase> cases;
  for (const auto& c : index["cases"]) {
    cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>(),
                     testing::read_f32_file(goldens_dir + "/" + c["logits_file"].get<std::string>())});
  }
  return cases;
}

std::string id_line(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  return line;
}

// The largest |logit - reference| a file of this type may show: what the fixtures showed
// (2026-12-04; F32 0.00004, F16 0.021, BF16 0.15, Q8_0 0.42, Q6_K 0.66, Q5_K_M 0.64, Q5_0 0.51,
// Q4_K_M 0.60, Q4_1 0.37, Q4_0 0.53, the worst file of each type) plus about a quarter. The
// quantized files' differences are llama.cpp rounding the activations to 8 bits (q8_0, q8_K)
// for its integer dot products: Tessera's logits from the Q4_0 file are 0.27 from llama.cpp's
// on the same file and 5.2 from its F32 file's, so both decode the same weights. The F32
// bound is the f32 fixtures' tolerance.
float gguf_logit_bound(const std::string& type) {
  static const std::map<std::string, float> kBound = {
      {"F32", 1e-3f},   {"F16", 0.03f},  {"BF16", 0.2f},    {"Q8_0", 0.55f}, {"Q6_K", 0.85f},
      {"Q5_K_M", 0.8f}, {"Q5_0", 0.65f}, {"Q4_K_M", 0.75f}, {"Q4_1", 0.5f},  {"Q4_0", 0.7f},
  };
  auto it = kBound.find(type);
  return it == kBound.end() ? 1.0f : it->second;
}

struct GgufFixture {
  std::string name;  // gguf-llama-Q4_0
  std::string type;  // Q4_0
};

std::vector<GgufFixture> gguf_fixtures() {
  std::vector<GgufFixture> out;
  const std::string dir = testing::fixtures_dir() + "/gguf";
  if (testing::fixtures_dir().empty() || !fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".gguf" || !fs::is_directory(dir + "/" + e.path().stem().string() + ".goldens")) continue;
    const nlohmann::json index =
        nlohmann::json::parse(testing::read_file(dir + "/" + e.path().stem().string() + ".goldens/index.json"));
    out.push_back({e.path().stem().string(), index["type"].get<std::string>()});
  }
  std::sort(out.begin(), out.end(), [](const GgufFixture& a, const GgufFixture& b) { return a.name < b.name; });
  return out;
}

// Runs one fixture file at `tp` ranks with `--quantize quantize` and checks it.
void check_gguf_file(const GgufFixture& f, int tp, const std::string& quantize) {
  const std::string gguf = testing::fixtures_dir() + "/gguf/" + f.name + ".gguf";
  const std::vector<GgufGoldenCase> cases = gguf_goldens(testing::fixtures_dir() + "/gguf/" + f.name + ".goldens");
  const std::string tmp = testing::make_temp_dir("tessera-gguf-gen");
  // Teacher-forced: one prompt per (case, row).
  std::string forced;
  for (const GgufGoldenCase& c : cases) {
    for (size_t s = 0; s < c.greedy.size(); ++s) {
      std::vector<int32_t> p = c.prompt;
      p.insert(p.end(), c.greedy.begin(), c.greedy.begin() + static_cast<std::ptrdiff_t>(s));
      forced += id_line(p) + "\n";
    }
  }
  testing::write_file(tmp + "/forced.txt", forced);
  const std::string base = testing::bin_dir() + "/tessera-generate --model " + gguf + " --dtype float32 --threads 2" +
                           " --quantize " + quantize + " --tensor-parallel " + std::to_string(tp);
  const testing::CommandResult r = testing::run_command(base + " --prompt-ids-file " + tmp + "/forced.txt" +
                                                        " --max-new-tokens 1 --json --dump-logits " + tmp + "/forced.f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<float> got = testing::read_f32_file(tmp + "/forced.f32");
  const size_t rows = forced.size() == 0 ? 0 : static_cast<size_t>(std::count(forced.begin(), forced.end(), '\n'));
  ASSERT_GT(rows, 0u);
  ASSERT_EQ(got.size() % rows, 0u);
  const int64_t vocab = static_cast<int64_t>(got.size() / rows);
  ASSERT_EQ(static_cast<size_t>(vocab) * cases[0].greedy.size(), cases[0].logits.size());

  const float bound = gguf_logit_bound(f.type);
  float worst = 0;
  int argmax_checked = 0;
  size_t row = 0;
  for (const GgufGoldenCase& c : cases) {
    for (size_t s = 0; s < c.greedy.size(); ++s, ++row) {
      const float* mine = &got[row * vocab];
      const float* ref = &c.logits[s * vocab];
      float diff = 0;
      for (int64_t v = 0; v < vocab; ++v) diff = std::max(diff, std::fabs(mine[v] - ref[v]));
      worst = std::max(worst, diff);
      EXPECT_LE(diff, bound) << "case prompt " << id_line(c.prompt) << " row " << s;
      if (testing::top2_margin(ref, vocab) > 2 * bound) {
        ++argmax_checked;
        EXPECT_EQ(std::max_element(mine, mine + vocab) - mine, c.greedy[s]) << "row " << s;
      }
    }
  }
  // Free-running, every case alone in one batch: greedy ids up to the first near-tie row.
  std::string prompts;
  for (const GgufGoldenCase& c : cases) prompts += id_line(c.prompt) + "\n";
  testing::write_file(tmp + "/prompts.txt", prompts);
  const testing::CommandResult free =
      testing::run_command(base + " --prompt-ids-file " + tmp + "/prompts.txt --max-new-tokens " +
                           std::to_string(cases[0].greedy.size()) + " --json");
  ASSERT_EQ(free.exit_code, 0) << free.err;
  std::istringstream lines(free.out);
  std::string line;
  size_t fewest_trusted = SIZE_MAX;
  for (const GgufGoldenCase& c : cases) {
    ASSERT_TRUE(std::getline(lines, line));
    const std::vector<int32_t> out = nlohmann::json::parse(line)["output_ids"].get<std::vector<int32_t>>();
    size_t trusted = 0;
    while (trusted < c.greedy.size() && testing::top2_margin(&c.logits[trusted * vocab], vocab) > 2 * bound) ++trusted;
    fewest_trusted = std::min(fewest_trusted, trusted);
    for (size_t s = 0; s < trusted; ++s) ASSERT_EQ(out.at(s), c.greedy[s]) << "row " << s << " of " << line;
  }
  std::cout << "[ REPORT   ] " << f.name << " tp" << tp << " --quantize " << quantize << ": max |logit - llama.cpp| = " << worst << " (bound "
            << bound << "), argmax checked on " << argmax_checked << " of " << rows
            << " rows, greedy ids checked up to the first near tie (at least " << fewest_trusted << " of "
            << cases[0].greedy.size() << " per case)" << std::endl;
  fs::remove_all(tmp);
}

// Every file whose name starts with one of `prefixes`, at `tp` ranks. --quantize none: the
// file's decoded values in f32 (the default, auto, stores quantized matrices as 4-bit or
// int8 weights).
void check_gguf_files(int tp, const std::vector<std::string>& prefixes, const std::string& quantize = "none") {
  for (const GgufFixture& f : gguf_fixtures()) {
    for (const std::string& prefix : prefixes) {
      if (f.name.rfind(prefix, 0) != 0) continue;
      SCOPED_TRACE(f.name + " tp" + std::to_string(tp) + " --quantize " + quantize);
      check_gguf_file(f, tp, quantize);
    }
  }
}

// The sanitized build runs one file of each kind of block (float, q8_0, q4_0, the K-quant
// mix, and the other family): the same decoding code on the same shapes, at 5x the time.
TEST(GgufGenerate, EveryFixtureFileMatchesLlamaCppTeacherForcedAndGreedy) {
  TESSERA_REQUIRE_FIXTURES();
  if (gguf_fixtures().empty()) GTEST_SKIP() << "SKIPPED: no fixtures/gguf";
  if (testing::kSanitizedBuild) {
    check_gguf_files(1, {"gguf-llama-F32", "gguf-llama-Q4_K_M", "gguf-qwen2-Q8_0", "kjv-llama-Q4_0"});
  } else {
    check_gguf_files(1, {""});
  }
}

TEST(GgufGenerate, LlamaFilesAtTensorParallel2) {
  TESSERA_REQUIRE_FIXTURES();
  if (gguf_fixtures().empty()) GTEST_SKIP() << "SKIPPED: no fixtures/gguf";
  if (testing::kSanitizedBuild) {
    check_gguf_files(2, {"gguf-llama-Q4_K_M"});
  } else {
    check_gguf_files(2, {"gguf-llama-F32", "gguf-llama-Q4_K_M", "kjv-llama-Q8_0"});
  }
}

// The default, auto: q4_0 / q4_1 / q4_K matrices as 4-bit panels, q5_0 / q5_1 / q5_K ones as
// 5-bit and q6_K ones as 6-bit panels, value for value, x in 8 bits per group of 32 as
// llama.cpp carries it; q8_0 ones as int8. In a Q4_K_M file some layers' V is q6_K beside a
// q4_K Q and K: those layers project q, k and v separately.
TEST(GgufGenerate, FourBitFilesWithTheDefaultQuantization) {
  TESSERA_REQUIRE_FIXTURES();
  if (gguf_fixtures().empty()) GTEST_SKIP() << "SKIPPED: no fixtures/gguf";
  if (testing::kSanitizedBuild) {  // one file of each 4-bit scheme, at 5x the time
    check_gguf_files(1, {"gguf-llama-Q4_K_M", "kjv-llama-Q4_0"}, "auto");
    return;
  }
  check_gguf_files(1,
                   {"gguf-llama-Q4_0", "gguf-llama-Q4_1", "gguf-llama-Q5_0", "gguf-llama-Q4_K_M", "gguf-llama-Q5_K_M",
                    "gguf-llama-Q6_K", "gguf-qwen2-Q4_K_M", "kjv-llama-Q4_0"},
                   "auto");
  // kjv-llama's row-parallel inputs split on q4_0's block boundaries (96 of 192); the tiny
  // Llama's split inside q4_K's 256-input blocks, so those matrices are decoded (int8).
  check_gguf_files(2, {"gguf-llama-Q4_K_M", "kjv-llama-Q4_0"}, "auto");
}

}  // namespace
}  // namespace tessera
