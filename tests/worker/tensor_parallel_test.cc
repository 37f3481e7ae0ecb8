// Tensor parallelism on CPU ranks in separate processes: each forked rank loads only its
// slices, the ranks run in lock-step through the shared-memory communicator, and rank 0's
// greedy tokens and logits must match the reference fixtures exactly as TP = 1 does.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "tests/worker/golden_model_fixture.h"
#include "worker/auto_tp.h"
#include "worker/generator.h"
#include "worker/shm_communicator.h"
#include "worker/transformer.h"

namespace tessera {
namespace {

struct TpRun {
  std::string model;
  int world;
  bool inject;
  bool keep_w2 = false;  // plan from the auto-TP planner with keep_linear {w2: mixtral}
};

// Runs in a forked rank: loads, generates every golden case, and (rank 0) writes the
// worst logit error and whether all tokens matched. Returns the process exit code.
int run_rank(const TpRun& p, int rank, const std::string& group, const std::string& result_path,
             const TpPlan* plan) {
  auto comm = make_shm_communicator(group, rank, p.world, size_t{1} << 20, 20000);
  if (!comm.is_ok()) {
    std::cerr << "rank " << rank << ": " << comm.status().to_string() << std::endl;
    return 2;
  }
  auto backend = make_backend("cpu", 1);  // one thread per rank: the ranks share the cores
  ModelLoadOptions lo;
  lo.kernel_inject = p.inject;
  lo.comm = comm.value().get();
  lo.plan = plan;
  const std::string dir = testing::fixtures_dir() + "/" + p.model;
  auto model = Transformer::load(dir, lo, *backend.value());
  if (!model.is_ok()) {
    std::cerr << "rank " << rank << ": " << model.status().to_string() << std::endl;
    return 3;
  }
  std::ifstream in(dir + "/goldens/index.json");
  auto index = nlohmann::json::parse(in);
  const std::vector<GenerationRequest> reqs = testing::golden_generation_requests(dir);
  Generator gen(*model.value(), *backend.value());
  auto results = gen.generate(reqs, /*keep_logits=*/true);
  if (!results.is_ok()) return 4;
  if (rank != 0) return 0;
  nlohmann::json out;
  float worst = 0;
  bool tokens_match = true;
  const int64_t vocab = model.value()->config().vocab;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& c = index["cases"][i];
    tokens_match &= results.value()[i].output == c["greedy_ids"].get<std::vector<int32_t>>();
    auto ref = testing::read_f32_file(dir + "/goldens/" + c["logits_file"].get<std::string>());
    const auto& got = results.value()[i].logits;
    for (size_t k = 0; k < std::min(ref.size(), got.size()); ++k) worst = std::max(worst, std::fabs(ref[k] - got[k]));
    (void)vocab;
  }
  out["tokens_match"] = tokens_match;
  out["max_logit_error"] = worst;
  std::ofstream(result_path) << out.dump();
  return 0;
}

class TensorParallelTest : public ::testing::TestWithParam<TpRun> {};

TEST_P(TensorParallelTest, RanksInSeparateProcessesReproduceTheReference) {
  TESSERA_REQUIRE_FIXTURES();
  const TpRun p = GetParam();
  const std::string tmp = testing::make_temp_dir("tessera-tp");
  const std::string result = tmp + "/rank0.json";
  const std::string group = "tp-test-" + std::to_string(getpid()) + "-" + std::to_string(p.world);
  std::optional<TpPlan> plan;
  if (p.keep_w2) {
    const std::string dir = testing::fixtures_dir() + "/" + p.model;
    auto ckpt = Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok());
    auto config = parse_model_config(ckpt.value()->config(), dir);
    ASSERT_TRUE(config.is_ok());
    AutoTpOptions options;
    options.keep_linear["w2"] = "mixtral";
    auto planned = plan_tensor_parallel(config.value(), ckpt.value()->tensor_names(), options, p.world);
    ASSERT_TRUE(planned.is_ok()) << planned.status().to_string();
    EXPECT_EQ(planned.value().role_of("model.layers.0.block_sparse_moe.experts.1.w2.weight"), TpRole::kKeep);
    plan = planned.value();
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < p.world; ++rank) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(120);  // a stuck rank must not outlive the test
      _exit(run_rank(p, rank, group, result, plan ? &*plan : nullptr));
    }
    pids.push_back(pid);
  }
  for (int rank = 0; rank < p.world; ++rank) {
    int status = 0;
    waitpid(pids[rank], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " status " << status;
  }
  std::ifstream in(result);
  ASSERT_TRUE(in.good()) << "rank 0 wrote no result";
  auto r = nlohmann::json::parse(in);
  EXPECT_TRUE(r["tokens_match"].get<bool>());
  EXPECT_LE(r["max_logit_error"].get<float>(), 1e-3f);
  std::cout << "[ REPORT   ] " << p.model << " TP=" << p.world << (p.inject ? " fused" : " plain")
            << (p.keep_w2 ? " (w2 kept whole)" : "")
            << ": max |logit - reference| = " << r["max_logit_error"] << std::endl;
  std::filesystem::remove_all(tmp);
}

std::vector<TpRun> params() {
  std::vector<TpRun> out;
  for (bool inject : {true, false}) {
    out.push_back({"tiny-bloom", 2, inject});
    out.push_back({"tiny-bloom", 3, inject});  // 6 heads; vocab 1024 split unevenly (342, 342, 340)
    out.push_back({"tiny-llama", 2, inject});  // 4 heads, 2 KV heads
    out.push_back({"tiny-llama", 4, inject});  // more ranks than KV heads: KV heads replicated
    out.push_back({"tiny-mixtral", 2, inject});
    out.push_back({"tiny-mixtral", 2, inject, /*keep_w2=*/true});
    out.push_back({"kjv-llama", 2, inject});  // 3 KV heads on 2 ranks: KV head 1 on both
  }
  return out;
}

std::string tp_run_name(const ::testing::TestParamInfo<TpRun>& info) {
  std::string m = info.param.model;
  for (char& c : m) if (c == '-') c = '_';
  return m + "_tp" + std::to_string(info.param.world) + (info.param.inject ? "_fused" : "_plain") +
         (info.param.keep_w2 ? "_keep_w2" : "");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelTest, ::testing::ValuesIn(params()), tp_run_name);

TEST(ShardSpec, UnevenSplitsAreRejectedNamingTheSizes) {
  TESSERA_REQUIRE_FIXTURES();
  std::ifstream in(testing::fixtures_dir() + "/kjv-llama/config.json");
  auto config = parse_model_config(nlohmann::json::parse(in), "kjv-llama/config.json");
  ASSERT_TRUE(config.is_ok());
  // 6 heads, 3 KV heads, FFN 512. At TP 2 the KV heads are shared (rank 0: 0-1, rank 1: 1-2).
  auto two = ShardSpec::make(config.value(), 1, 2);
  ASSERT_TRUE(two.is_ok()) << two.status().to_string();
  EXPECT_EQ(two.value().kv_head_offset, 1);
  EXPECT_EQ(two.value().kv_heads, 2);
  auto three = ShardSpec::make(config.value(), 1, 3);
  ASSERT_FALSE(three.is_ok());
  EXPECT_NE(three.status().message().find("MLP intermediate size (512)"), std::string::npos) << three.status().message();
  auto four = ShardSpec::make(config.value(), 0, 4);
  ASSERT_FALSE(four.is_ok());
  EXPECT_NE(four.status().message().find("attention heads (6)"), std::string::npos) << four.status().message();
}

}  // namespace
}  // namespace tessera
