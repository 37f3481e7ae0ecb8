// tessera-worker as an operator runs it: the printed TP plan, DeepSpeed's environment
// variables, and bad configurations failing at start with one clear line.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/test_support.h"

namespace tessera {
namespace {

class WorkerCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("tessera-worker-cli"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string config(const std::string& yaml) {
    const std::string path = dir_ + "/c" + std::to_string(n_++) + ".yaml";
    testing::write_file(path, yaml);
    return path;
  }
  testing::CommandResult worker(const std::string& args, const std::string& env = "") {
    return testing::run_command(env + " " + testing::bin_dir() + "/tessera-worker " + args);
  }
  // The line of the printed plan for `tensor`.
  static std::string line_of(const std::string& table, const std::string& tensor) {
    size_t at = table.find(tensor + " ");
    if (at == std::string::npos) return "";
    return table.substr(at, table.find('\n', at) - at);
  }

  std::string dir_;
  int n_ = 0;
};

TEST_F(WorkerCliTest, MixtralPlanSplitsW2ByRowAndKeepsTheRouter) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string c = config("model: {path: " + testing::fixtures_dir() + "/tiny-mixtral}\nparallel: {tensor_parallel: 2}\n");
  auto r = worker("--config " + c + " --print-tp-plan");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(line_of(r.out, "model.layers.1.block_sparse_moe.experts.3.w2.weight").find(" row "), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "model.layers.1.block_sparse_moe.gate.weight").find(" keep "), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "model.layers.0.block_sparse_moe.experts.0.w1.weight").find("[64, 64]"), std::string::npos)
      << r.out;

  // Moving w2 to keep, in YAML and through DeepSpeed's environment variable.
  const std::string kept = config("model: {path: " + testing::fixtures_dir() +
                                  "/tiny-mixtral}\nparallel: {tensor_parallel: 2, auto_tp: {keep_linear: {w2: mixtral}}}\n");
  auto y = worker("--config " + kept + " --print-tp-plan");
  ASSERT_EQ(y.exit_code, 0) << y.err;
  EXPECT_NE(line_of(y.out, "model.layers.1.block_sparse_moe.experts.3.w2.weight").find(" keep "), std::string::npos);
  auto e = worker("--config " + c + " --print-tp-plan", "DS_KEEP_LINEAR_ITEMS=\"{'w2':'mixtral'}\"");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(line_of(e.out, "model.layers.1.block_sparse_moe.experts.3.w2.weight").find(" keep "), std::string::npos);
  // The expert is then computed whole on every rank: its w1/w3 are kept too.
  EXPECT_NE(line_of(e.out, "model.layers.1.block_sparse_moe.experts.3.w1.weight").find("[128, 64]   [128, 64]"),
            std::string::npos) << line_of(e.out, "model.layers.1.block_sparse_moe.experts.3.w1.weight");
}

TEST_F(WorkerCliTest, BadConfigurationsFailAtStartNamingTheProblem) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  auto unknown = worker("--config " + config("model: {path: " + model + "}\nparallel: {tensor_paralel: 2}\n"));
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("parallel.tensor_paralel"), std::string::npos) << unknown.err;

  auto heads = worker("--config " + config("model: {path: " + model + "}\nparallel: {tensor_parallel: 3}\n") +
                      " --print-tp-plan");
  EXPECT_EQ(heads.exit_code, 1);
  EXPECT_NE(heads.err.find("divisible by tensor_parallel 3"), std::string::npos) << heads.err;

  auto rank = worker("--config " + config("model: {path: " + model + "}\n") + " --rank 2");
  EXPECT_EQ(rank.exit_code, 1);
  EXPECT_NE(rank.err.find("--rank 2"), std::string::npos) << rank.err;

  // Nobody listens at the control address: the worker gives up after its register timeout.
  auto unreachable = worker("--config " + config("model: {path: " + model + "}\nserver: {control: 'ipc://" + dir_ +
                                                 "/nobody.ipc', heartbeat_ms: 50, heartbeat_misses: 2}\n"));
  EXPECT_EQ(unreachable.exit_code, 1);
  EXPECT_NE(unreachable.err.find("nobody.ipc"), std::string::npos) << unreachable.err;
}

}  // namespace
}  // namespace tessera
