// A worker process dies mid-generation: the request in flight ends with an error within two
// heartbeat intervals, the group reports itself incomplete and refuses new work clearly,
// and once the dead ranks are restarted the same coordinator serves again — without being
// restarted itself. Real processes: the coordinator side runs here, the ranks are
// tessera-worker programs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/config.h"
#include "coordinator/cluster.h"
#include "coordinator/engine.h"
#include "coordinator/local_workers.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

TEST(WorkerFault, DeadRankFailsTheRequestAndRestartedRanksRejoin) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string model = testing::fixtures_dir() + "/tiny-llama";
  std::ifstream in(model + "/goldens/index.json");
  const auto golden = nlohmann::json::parse(in)["cases"][2];
  const std::string dir = testing::make_temp_dir("tessera-fault");
  const int heartbeat_ms = 200;

  TesseraConfig c;
  c.model.path = model;
  c.model.dtype = DType::kF32;
  c.parallel.tensor_parallel = 2;
  c.server.control = "ipc://" + dir + "/control.ipc";
  c.server.heartbeat_ms = heartbeat_ms;
  c.worker.backend = BackendKind::kCpu;
  c.worker.threads = 1;
  c.cache.num_blocks = 160;
  std::ofstream(dir + "/config.yaml") << dump_config_yaml(c);

  SchedulerConfig sc;
  sc.num_blocks = 160;
  sc.max_model_len = 2048;
  ClusterOptions co;
  co.config = c;
  co.group_name = "fault-" + std::to_string(getpid());
  auto cluster = start_cluster(co);
  ASSERT_TRUE(cluster.is_ok()) << cluster.status().to_string();
  auto& group = cluster.value().group;
  LocalWorkers workers;
  ASSERT_TRUE(workers.start(testing::bin_dir() + "/tessera-worker", dir + "/config.yaml", 2).is_ok());
  ASSERT_TRUE(group->wait_until_ready(std::chrono::seconds(60)).is_ok());

  Engine engine(sc, *group);
  auto request = [&](int max_new) {
    EngineRequest r;
    r.prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
    r.max_new_tokens = max_new;
    r.stop.ignore_eos = true;
    auto id = engine.add_request(r);
    EXPECT_TRUE(id.is_ok());
    return id.value();
  };

  // 1. A long request is running when rank 1 is killed.
  request(1500);
  for (int i = 0; i < 5; ++i) {
    for (const auto& ev : engine.step()) ASSERT_NE(ev.reason, FinishReason::kError) << ev.error;
  }
  kill(workers.pid(1), SIGKILL);
  const auto killed = Clock::now();
  std::string error;
  while (error.empty() && Clock::now() - killed < std::chrono::seconds(10)) {
    for (const auto& ev : engine.step()) {
      if (ev.finished && ev.reason == FinishReason::kError) error = ev.error;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_FALSE(error.empty()) << "the request never failed";
  EXPECT_LE(seconds, 2.0 * heartbeat_ms / 1000.0 + 0.2) << error;
  std::cout << "[ REPORT   ] request failed " << seconds * 1000 << " ms after the kill: " << error << std::endl;

  // 2. The group says it is incomplete, and new work is refused with that reason.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (group->is_complete() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(group->is_complete());
  request(4);
  std::string refused;
  for (const auto& ev : engine.step()) refused += ev.error;
  EXPECT_NE(refused.find("incomplete"), std::string::npos) << refused;

  // 3. Supervise as tessera-serve does: restart every rank whose process exited (rank 0
  // leaves too once its collective fails) until the group is whole again.
  const auto whole_by = Clock::now() + std::chrono::seconds(60);
  while (!group->is_complete() && Clock::now() < whole_by) {
    workers.restart_exited();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(group->wait_until_ready(std::chrono::seconds(30)).is_ok());
  const SeqId id = request(static_cast<int>(golden["greedy_ids"].size()));
  std::vector<int32_t> out;
  while (engine.has_work()) {
    for (const auto& ev : engine.step()) {
      ASSERT_NE(ev.reason, FinishReason::kError) << ev.error;
      if (ev.seq_id == id) {
        for (const auto& t : ev.new_tokens) out.push_back(t.token);
      }
    }
  }
  EXPECT_EQ(out, golden["greedy_ids"].get<std::vector<int32_t>>());
  group->shutdown();
  workers.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
