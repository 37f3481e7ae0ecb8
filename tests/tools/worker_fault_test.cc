// A worker process dies mid-generation: the request in flight ends with an error within two
// heartbeat intervals, the group reports itself incomplete and refuses new work clearly,
// and once the dead ranks are restarted the same coordinator serves again — without being
// restarted itself. A worker restarted between steps holds no sequence state: it is sent
// every sequence in full again and the generation ends with the reference tokens; a step
// whose sequence version does not follow what a worker holds is refused, not computed.
// Real processes: the coordinator side runs here, the ranks are tessera-worker programs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "common/config.h"
#include "coordinator/cluster/cluster.h"
#include "coordinator/engine/engine.h"
#include "coordinator/cluster/local_workers.h"
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
  RequestId next_id = 1;
  auto request = [&](int max_new) {
    StopConditions stop;
    stop.ignore_eos = true;
    const RequestId id = next_id++;
    EXPECT_TRUE(engine.add_request(id, make_request(golden["prompt_ids"].get<std::vector<int32_t>>(), max_new, {}, stop)).is_ok());
    return id;
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

// One tessera-worker on tiny-llama behind a WorkerGroup, for the step-delta tests.
struct OneWorker {
  std::string dir;
  std::unique_ptr<WorkerGroup> group;
  LocalWorkers workers;
  nlohmann::json golden;

  void start() {
    const std::string model = testing::fixtures_dir() + "/tiny-llama";
    std::ifstream in(model + "/goldens/index.json");
    golden = nlohmann::json::parse(in)["cases"][2];
    dir = testing::make_temp_dir("tessera-delta");
    TesseraConfig c;
    c.model.path = model;
    c.model.dtype = DType::kF32;
    c.server.control = "ipc://" + dir + "/control.ipc";
    c.server.heartbeat_ms = 200;
    c.worker.backend = BackendKind::kCpu;
    c.worker.threads = 1;
    c.cache.num_blocks = 64;
    std::ofstream(dir + "/config.yaml") << dump_config_yaml(c);
    ClusterOptions co;
    co.config = c;
    co.group_name = "delta-" + std::to_string(getpid());
    auto g = start_cluster(co);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    group = std::move(g.value().group);
    ASSERT_TRUE(workers.start(testing::bin_dir() + "/tessera-worker", dir + "/config.yaml", 1).is_ok());
    ASSERT_TRUE(group->wait_until_ready(std::chrono::seconds(60)).is_ok());
  }
  ~OneWorker() {
    if (group) group->shutdown();
    workers.stop();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  std::vector<int32_t> prompt() const { return golden["prompt_ids"].get<std::vector<int32_t>>(); }
  std::vector<int32_t> greedy() const { return golden["greedy_ids"].get<std::vector<int32_t>>(); }
};

TEST(WorkerFault, RestartedWorkerIsSentItsSequencesInFullAndTheTokensMatchTheReference) {
  TESSERA_REQUIRE_FIXTURES();
  OneWorker w;
  ASSERT_NO_FATAL_FAILURE(w.start());
  SchedulerConfig sc;
  sc.num_blocks = 64;
  Engine engine(sc, *w.group);
  StopConditions stop;
  stop.ignore_eos = true;
  ASSERT_TRUE(engine.add_request(1, make_request(w.prompt(), static_cast<int>(w.greedy().size()), {}, stop)).is_ok());
  std::vector<int32_t> out;
  auto step = [&] {
    for (const auto& ev : engine.step()) {
      ASSERT_NE(ev.reason, FinishReason::kError) << ev.error;
      for (const auto& t : ev.new_tokens) out.push_back(t.token);
    }
  };
  while (out.size() < 3) ASSERT_NO_FATAL_FAILURE(step());

  // Killed between two steps and restarted: the new process holds no state for the sequence.
  kill(w.workers.pid(0), SIGKILL);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (w.group->is_complete() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_FALSE(w.group->is_complete());
  while (!w.group->is_complete() && Clock::now() < deadline + std::chrono::seconds(50)) {
    w.workers.restart_exited();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(w.group->wait_until_ready(std::chrono::seconds(30)).is_ok());

  while (engine.has_work()) ASSERT_NO_FATAL_FAILURE(step());
  EXPECT_EQ(out, w.greedy()) << "the re-sent state continues the generation exactly";
  EXPECT_EQ(engine.scheduler().stats().num_preemptions, 1u) << "the lost KV is recomputed from the tokens";
}

TEST(WorkerFault, AStepWithAWrongSequenceVersionIsRefusedNotComputed) {
  TESSERA_REQUIRE_FIXTURES();
  OneWorker w;
  ASSERT_NO_FATAL_FAILURE(w.start());
  const std::vector<int32_t> prompt = w.prompt(), greedy = w.greedy();
  ASSERT_GE(greedy.size(), 3u);
  StepPlan start;
  start.step_id = 1;
  SeqStep& s = start.seqs.emplace_back();
  s.seq_id = 5;
  s.version = 1;
  s.tokens = prompt;
  s.sample = true;
  for (int32_t b = 0; b < 8; ++b) s.new_blocks.push_back(b);
  s.start.emplace().prompt_len = static_cast<int32_t>(prompt.size());
  auto first = w.group->execute(start);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_EQ(first->tokens.at(0).token, greedy[0]);

  auto decode = [&](uint64_t step_id, uint32_t version, int32_t token, int32_t num_computed) {
    StepPlan p;
    p.step_id = step_id;
    SeqStep& d = p.seqs.emplace_back();
    d.seq_id = 5;
    d.version = version;
    d.tokens = {token};
    d.num_computed = num_computed;
    d.sample = true;
    d.table_from = 8;
    return w.group->execute(p);
  };
  const int32_t n = static_cast<int32_t>(prompt.size());
  // Version 3 claims a step the worker never ran: refused with both versions named.
  auto skipped = decode(2, 3, greedy[0], n);
  ASSERT_FALSE(skipped.is_ok());
  EXPECT_NE(skipped.status().message().find("sequence 5: version 3 does not follow version 1"), std::string::npos)
      << skipped.status().to_string();
  // A delta for a sequence the worker never started.
  StepPlan unknown;
  unknown.step_id = 3;
  SeqStep& u = unknown.seqs.emplace_back();
  u.seq_id = 6;
  u.version = 2;
  u.tokens = {1};
  u.num_computed = 4;
  u.sample = true;
  auto refused = w.group->execute(unknown);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("does not hold"), std::string::npos) << refused.status().to_string();
  // Nothing was computed: the right versions continue exactly as a clean run does.
  auto second = decode(4, 2, greedy[0], n);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_EQ(second->tokens.at(0).token, greedy[1]);
  auto third = decode(5, 3, greedy[1], n + 1);
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  EXPECT_EQ(third->tokens.at(0).token, greedy[2]);
}

}  // namespace
}  // namespace tessera
