// WorkerGroupOptions::on_all_registered over real ZeroMQ sockets: assignments are held until
// every rank has registered, the hook sees every rank's report (its memory), and a refusal
// reaches the workers and ends wait_until_ready with the reason.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "coordinator/cluster/worker_group.h"
#include "worker/worker_link.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A worker thread that reports `free_bytes` and records the KV pool it was assigned.
struct ReportingWorker {
  ReportingWorker(const std::string& address, int rank, int world, uint64_t free_bytes) {
    WorkerLinkOptions o;
    o.coordinator_address = address;
    o.rank = rank;
    o.world_size = world;
    o.heartbeat_interval = 100ms;
    o.register_timeout = 20s;
    o.free_memory_bytes = free_bytes;
    o.total_memory_bytes = 2 * free_bytes;
    link = std::make_unique<WorkerLink>(o);
    thread = std::thread([this] {
      result = link->run(
          [this](const wire::Assignment& a) {
            assigned_blocks.store(a.kv_num_blocks);
            return Status::ok();
          },
          [](const StepPlan& p) -> StatusOr<StepResult> {
            StepResult r;
            r.step_id = p.step_id;
            return r;
          });
      done.store(true);
    });
  }
  ~ReportingWorker() {
    link->stop();
    if (thread.joinable()) thread.join();
  }
  std::unique_ptr<WorkerLink> link;
  std::thread thread;
  std::atomic<int> assigned_blocks{-1};
  std::atomic<bool> done{false};
  Status result;
};

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 10s) {
  const auto end = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(WorkerGroupSizing, AssignmentsWaitForEveryRankAndFollowTheSmallestReport) {
  std::mutex mu;
  std::vector<wire::Register> seen;
  std::atomic<int> pool{0};
  WorkerGroupOptions o;
  o.bind_address = "tcp://127.0.0.1:*";
  o.world_size = 2;
  o.heartbeat_interval = 100ms;
  o.on_all_registered = [&](const std::vector<wire::Register>& regs) {
    std::lock_guard<std::mutex> lock(mu);
    seen = regs;
    uint64_t smallest = UINT64_MAX;
    for (const wire::Register& r : regs) smallest = std::min(smallest, r.free_memory_bytes);
    pool.store(static_cast<int>(smallest / 1000));
    return Status::ok();
  };
  WorkerGroup group;
  ASSERT_TRUE(group.start(o, [&](int, const wire::Register&) {
                     wire::Assignment a;
                     a.kv_num_blocks = pool.load();
                     return a;
                   }).is_ok());
  ReportingWorker rank0(group.endpoint(), 0, 2, 700000);
  ASSERT_TRUE(eventually([&] { return group.status()[0].registered; }));
  // Registered, but held: rank 1 has not reported yet.
  EXPECT_EQ(rank0.assigned_blocks.load(), -1);
  EXPECT_FALSE(group.is_complete());
  EXPECT_NE(group.wait_until_ready(1ms).message().find("rank 0 registered, its assignment held until every rank"),
            std::string::npos);
  ReportingWorker rank1(group.endpoint(), 1, 2, 300000);
  ASSERT_TRUE(group.wait_until_ready(20s).is_ok());
  EXPECT_EQ(rank0.assigned_blocks.load(), 300);
  EXPECT_EQ(rank1.assigned_blocks.load(), 300);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].rank, 0);
  EXPECT_EQ(seen[0].free_memory_bytes, 700000u);
  EXPECT_EQ(seen[1].free_memory_bytes, 300000u);
  EXPECT_EQ(seen[1].total_memory_bytes, 600000u);
  group.shutdown();
}

TEST(WorkerGroupSizing, ARefusalReachesEveryWorkerAndEndsTheWait) {
  WorkerGroupOptions o;
  o.bind_address = "tcp://127.0.0.1:*";
  o.world_size = 2;
  o.heartbeat_interval = 100ms;
  o.on_all_registered = [](const std::vector<wire::Register>&) {
    return resource_exhausted("rank 1 has too little memory for one sequence");
  };
  WorkerGroup group;
  ASSERT_TRUE(group.start(o, [](int, const wire::Register&) { return wire::Assignment{}; }).is_ok());
  ReportingWorker rank0(group.endpoint(), 0, 2, 1000), rank1(group.endpoint(), 1, 2, 10);
  Status st = group.wait_until_ready(20s);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("too little memory"), std::string::npos);
  ASSERT_TRUE(eventually([&] { return rank0.done.load() && rank1.done.load(); }));
  rank0.thread.join();
  rank1.thread.join();
  for (const ReportingWorker* w : {&rank0, &rank1}) {
    EXPECT_EQ(w->result.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(w->result.message().find("rejected this worker: rank 1 has too little memory"), std::string::npos)
        << w->result.to_string();
    EXPECT_EQ(w->assigned_blocks.load(), -1);
  }
  group.shutdown();
}

TEST(WorkerGroupSizing, AFactoryErrorRefusesThatRank) {
  WorkerGroupOptions o;
  o.bind_address = "tcp://127.0.0.1:*";
  o.world_size = 1;
  o.heartbeat_interval = 100ms;
  WorkerGroup group;
  ASSERT_TRUE(group
                  .start(o,
                         [](int rank, const wire::Register& reg) -> StatusOr<wire::Assignment> {
                           return invalid_argument("rank " + std::to_string(rank) + " registered with backend '" +
                                                   reg.backend + "' but worker.backend is cuda");
                         })
                  .is_ok());
  ReportingWorker rank0(group.endpoint(), 0, 1, 1000);
  ASSERT_TRUE(eventually([&] { return rank0.done.load(); }));
  rank0.thread.join();
  EXPECT_EQ(rank0.result.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rank0.result.message().find("registered with backend 'cpu' but worker.backend is cuda"), std::string::npos)
      << rank0.result.to_string();
  EXPECT_FALSE(group.status()[0].alive);
  EXPECT_NE(group.status()[0].error.find("refused: rank 0 registered with backend 'cpu'"), std::string::npos)
      << group.status()[0].error;
  group.shutdown();
}

}  // namespace
}  // namespace tessera
