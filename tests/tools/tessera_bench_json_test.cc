// tessera-bench --json on a real (tiny) checkpoint: every field docs name is present, the
// fields of the two rooflines (issue 17) are there and are what they say — read and copy
// bandwidth and the peak FMA rate measured (positive), GFLOP/s and fractions consistent with
// each other — and a bad flag is a clear error. Values are not compared with any speed (no
// timed assertions); only their relations, which hold at any speed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "tests/test_support.h"

namespace tessera {
namespace {

// The probes' array sizes are fixed (256 MiB), so even on the tiny model a run takes a few
// seconds.
std::string bench_command(const std::string& args) {
  return "OMP_NUM_THREADS=2 " + testing::bin_dir() + "/tessera-bench " + args;
}

TEST(TesseraBenchJson, ReportsBothRooflines) {
  if (!TESSERA_HAS_BENCH) GTEST_SKIP() << "SKIPPED: tessera-bench not built here (TESSERA_BUILD_BENCH=OFF)";
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  const testing::CommandResult r =
      testing::run_command(bench_command("--model " + model + " --prompt-len 8 --gen-len 4 --batch 2 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string last = r.out.substr(r.out.find_last_of('{'));
  const nlohmann::json j = nlohmann::json::parse(last);
  for (const char* key : {"prefill_tok_s", "decode_tok_s", "weight_bytes", "bandwidth_gb_s", "roofline_fraction",
                          "peak_rss_bytes", "read_bandwidth_gb_s", "copy_bandwidth_gb_s", "peak_gflop_s",
                          "prefill_gflop_s", "prefill_compute_fraction", "decode_gflop_s",
                          "decode_compute_fraction", "batch"}) {
    ASSERT_TRUE(j.contains(key)) << "missing " << key << " in " << last;
    ASSERT_TRUE(j[key].is_number()) << key << " in " << last;
    EXPECT_TRUE(std::isfinite(j[key].get<double>())) << key << " in " << last;
    EXPECT_GT(j[key].get<double>(), 0.0) << key << " in " << last;
  }
  EXPECT_EQ(j["batch"].get<int>(), 2);
  // On the CPU the roofline divides by the read bandwidth.
  EXPECT_DOUBLE_EQ(j["bandwidth_gb_s"].get<double>(), j["read_bandwidth_gb_s"].get<double>());
  const double peak = j["peak_gflop_s"].get<double>();
  EXPECT_NEAR(j["prefill_compute_fraction"].get<double>(), j["prefill_gflop_s"].get<double>() / peak, 1e-9);
  EXPECT_NEAR(j["decode_compute_fraction"].get<double>(), j["decode_gflop_s"].get<double>() / peak, 1e-9);
}

// --repetitions runs the timed generation that many times and sums them: the steps are the
// runs' steps added up (gen-len 4: 3 decode steps a run).
TEST(TesseraBenchJson, RepetitionsSumTheTimedRuns) {
  if (!TESSERA_HAS_BENCH) GTEST_SKIP() << "SKIPPED: tessera-bench not built here (TESSERA_BUILD_BENCH=OFF)";
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  const testing::CommandResult r = testing::run_command(
      bench_command("--model " + model + " --prompt-len 8 --gen-len 4 --batch 2 --repetitions 3 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find_last_of('{')));
  EXPECT_EQ(j["repetitions"].get<int>(), 3);
  EXPECT_EQ(j["decode_steps"].get<int>(), 3 * 3);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0.0);
}

TEST(TesseraBenchJson, RefusesRepetitionsItCannotRun) {
  if (!TESSERA_HAS_BENCH) GTEST_SKIP() << "SKIPPED: tessera-bench not built here (TESSERA_BUILD_BENCH=OFF)";
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  const testing::CommandResult zero = testing::run_command(bench_command("--model " + model + " --repetitions 0 --json"));
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.err.find("--repetitions must be >= 1"), std::string::npos) << zero.err;
  const testing::CommandResult engine =
      testing::run_command(bench_command("--model " + model + " --repetitions 2 --engine --json"));
  EXPECT_NE(engine.exit_code, 0);
  EXPECT_NE(engine.err.find("--repetitions is for the bare generation loop"), std::string::npos) << engine.err;
}

TEST(TesseraBenchJson, RejectsAnUnknownDtype) {
  if (!TESSERA_HAS_BENCH) GTEST_SKIP() << "SKIPPED: tessera-bench not built here (TESSERA_BUILD_BENCH=OFF)";
  TESSERA_REQUIRE_FIXTURES();
  const testing::CommandResult r =
      testing::run_command(bench_command("--model " + testing::fixtures_dir() + "/tiny-llama --dtype int4 --json"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
