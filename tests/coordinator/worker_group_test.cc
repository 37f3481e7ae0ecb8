// WorkerGroup + WorkerLink over real ZeroMQ sockets (tcp loopback and ipc): workers are
// threads running WorkerLink with a fake step function, or a forked process for the
// crash test. Rank 0 returns deterministic tokens; the other ranks return status only.
#include "coordinator/cluster/worker_group.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "tests/test_support.h"
#include "worker/worker_link.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int32_t fake_token(SeqId id, int32_t index) { return static_cast<int32_t>((id * 7919 + index * 31) % 50000); }

StatusOr<StepResult> fake_step(const StepPlan& plan) {
  StepResult r;
  r.step_id = plan.step_id;
  for (const SeqStep& s : plan.seqs)
    if (s.sample) r.tokens.push_back(SampledToken{s.seq_id, fake_token(s.seq_id, static_cast<int32_t>(s.version) - 1), -0.5f, {}});
  return r;
}

// The step answered with no tokens (the tests that use it look only at how the step ends).
StepResult empty_result(const StepPlan& plan) {
  StepResult r;
  r.step_id = plan.step_id;
  return r;
}

StepPlan decode_plan(uint64_t step_id, int num_seqs) {
  StepPlan p;
  p.step_id = step_id;
  for (int i = 0; i < num_seqs; ++i) {
    SeqStep s;
    s.seq_id = 100 + i;
    s.tokens = {static_cast<int32_t>(i + 1)};
    s.num_computed = 40 + static_cast<int32_t>(step_id);
    s.new_blocks = {i * 4, i * 4 + 1, i * 4 + 2, i * 4 + 3};
    s.sample = true;
    s.version = static_cast<uint32_t>(step_id) + 1;  // the fake step's token index
    p.seqs.push_back(std::move(s));
  }
  return p;
}

wire::Assignment make_assignment(int rank, const wire::Register&) {
  wire::Assignment a;
  a.model_path = "models/fake";
  a.dtype = "float32";
  a.kv_block_size = 16;
  a.kv_num_blocks = 64;
  a.kv_dtype = "float32";
  a.collective_bootstrap = "shm-group-" + std::to_string(rank);
  return a;
}

// One worker thread running a WorkerLink.
struct FakeWorker {
  FakeWorker(const std::string& address, int rank, int world, std::chrono::milliseconds interval,
             WorkerStepFn step = fake_step, WorkerSetupFn setup = nullptr, uint16_t version = wire::kProtocolVersion) {
    WorkerLinkOptions o;
    o.coordinator_address = address;
    o.rank = rank;
    o.world_size = world;
    o.heartbeat_interval = interval;
    o.register_timeout = 5s;
    o.protocol_version = version;
    link = std::make_unique<WorkerLink>(o);
    if (!setup) setup = [this](const wire::Assignment& a) {
      assignment = a;
      return Status::ok();
    };
    thread = std::thread([this, step, setup] {
      result = link->run(setup, step);
      done = true;
    });
  }
  ~FakeWorker() { join(); }
  void join() {
    if (thread.joinable()) {
      link->stop();
      thread.join();
    }
  }
  // Waits for run() to return (without stopping it).
  bool wait_done(std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    while (!done && Clock::now() < end) std::this_thread::sleep_for(2ms);
    if (done && thread.joinable()) thread.join();
    return done;
  }

  std::unique_ptr<WorkerLink> link;
  std::thread thread;
  std::atomic<bool> done{false};
  Status result;
  wire::Assignment assignment;
};

// A fresh ipc:// address, known before anything binds it, in a folder removed at the test
// program's exit (with the socket files).
std::string fresh_ipc_endpoint() {
  static const std::string dir = testing::make_temp_dir("tessera-wg");
  static int n = 0;
  return "ipc://" + dir + "/" + std::to_string(n++) + ".ipc";
}

// Rank `rank` as a separate process running a WorkerLink with the fake step function. Call
// it before this process has any thread: a child forked from a multithreaded parent can
// inherit a lock another thread held (the allocator's, the logger's) and hang.
pid_t fork_worker_process(const std::string& endpoint, int rank, int world, std::chrono::milliseconds interval) {
  const pid_t child = fork();
  if (child != 0) return child;
  alarm(60);  // a stuck child must not outlive the test
  WorkerLinkOptions o;
  o.coordinator_address = endpoint;
  o.rank = rank;
  o.world_size = world;
  o.heartbeat_interval = interval;
  WorkerLink link(o);
  Status st = link.run(nullptr, fake_step);
  _exit(st.is_ok() ? 0 : 1);
}

struct Group {
  explicit Group(int world, std::chrono::milliseconds interval = 100ms, std::string address = "tcp://127.0.0.1:*") {
    WorkerGroupOptions o;
    o.bind_address = std::move(address);
    o.world_size = world;
    o.heartbeat_interval = interval;
    Status st = group.start(o, make_assignment);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  WorkerGroup group;
};

void run_steps(WorkerGroup& group, int num_steps, int num_seqs, uint64_t first_id = 1) {
  for (uint64_t id = first_id; id < first_id + num_steps; ++id) {
    StatusOr<StepResult> r = group.execute(decode_plan(id, num_seqs));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->step_id, id);
    ASSERT_EQ(r->tokens.size(), static_cast<size_t>(num_seqs));
    for (int i = 0; i < num_seqs; ++i) {
      EXPECT_EQ(r->tokens[i].seq_id, 100u + i);
      EXPECT_EQ(r->tokens[i].token, fake_token(100 + i, static_cast<int32_t>(id)));
    }
  }
}

class WorkerGroupWorldTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(WorkerGroupWorldTest, ExecutesStepsOnEveryRank) {
  const auto [world, use_ipc] = GetParam();
  const std::string address =
      use_ipc ? fresh_ipc_endpoint() : "tcp://127.0.0.1:*";
  Group g(world, 100ms, address);
  std::vector<std::unique_ptr<FakeWorker>> workers;
  for (int r = 0; r < world; ++r)
    workers.push_back(std::make_unique<FakeWorker>(g.group.endpoint(), r, world, 100ms));
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 25, 8);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(workers[r]->link->steps_served(), 25u) << "rank " << r;
    EXPECT_EQ(workers[r]->assignment.rank, r);
    EXPECT_EQ(workers[r]->assignment.world_size, world);
    EXPECT_EQ(workers[r]->assignment.collective_bootstrap, "shm-group-" + std::to_string(r));
  }
  for (const RankStatus& s : g.group.status()) {
    EXPECT_TRUE(s.alive && s.ready) << "rank " << s.rank;
    EXPECT_EQ(s.registrations, 1);
    EXPECT_GE(s.ms_since_heard, 0);
  }
  g.group.shutdown("test over");
  for (auto& w : workers) {
    ASSERT_TRUE(w->wait_done(5s)) << "worker did not exit on Shutdown";
    EXPECT_TRUE(w->result.is_ok()) << w->result.to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, WorkerGroupWorldTest,
                         ::testing::Values(std::make_tuple(1, false), std::make_tuple(2, false),
                                           std::make_tuple(3, false), std::make_tuple(2, true)));

TEST(WorkerGroupTest, RefusesStepsWhileIncomplete) {
  Group g(2);
  FakeWorker w0(g.group.endpoint(), 0, 2, 100ms);
  Status st = g.group.wait_until_ready(300ms);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("rank 1 not registered yet"), std::string::npos) << st.to_string();
  StatusOr<StepResult> r = g.group.execute(decode_plan(1, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("worker group incomplete (1/2 ranks ready)"), std::string::npos)
      << r.status().to_string();
}

TEST(WorkerGroupTest, SilentRankDeclaredDeadWithinTwoIntervalsThenRejoins) {
  constexpr auto kInterval = 60ms;
  Group g(3, kInterval);
  auto w0 = std::make_unique<FakeWorker>(g.group.endpoint(), 0, 3, kInterval);
  auto w1 = std::make_unique<FakeWorker>(g.group.endpoint(), 1, 3, kInterval);
  auto w2 = std::make_unique<FakeWorker>(g.group.endpoint(), 2, 3, kInterval);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 5, 4);

  // Rank 1 goes silent like a crashed process: no goodbye, no more heartbeats.
  const auto killed = Clock::now();
  w1->link->stop(/*silently=*/true);
  while (g.group.status()[1].alive && Clock::now() - killed < 2s) std::this_thread::sleep_for(1ms);
  const auto detected = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  const RankStatus s1 = g.group.status()[1];
  ASSERT_FALSE(s1.alive);
  // Dead once silent for > 2 intervals since its last heartbeat (which came before the kill);
  // allow one poll tick plus scheduling noise on a loaded machine.
  EXPECT_LE(detected.count(), 2 * kInterval.count() + 60) << "took " << detected.count() << " ms";
  // A closed connection is noticed at the next heartbeat send; a hung one by the timeout.
  EXPECT_TRUE(s1.error.find("no heartbeat for") != std::string::npos ||
              s1.error.find("unreachable") != std::string::npos)
      << s1.error;

  StatusOr<StepResult> r = g.group.execute(decode_plan(6, 4));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("rank 1 dead"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(g.group.status()[0].alive);
  EXPECT_TRUE(g.group.status()[2].alive);

  // A restarted rank 1 registers again, is re-assigned, and steps succeed again.
  w1.reset();
  auto w1b = std::make_unique<FakeWorker>(g.group.endpoint(), 1, 3, kInterval);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  EXPECT_EQ(w1b->assignment.rank, 1);
  EXPECT_EQ(g.group.status()[1].registrations, 2);
  run_steps(g.group, 5, 4, 7);
}

TEST(WorkerGroupTest, RankDyingDuringStepFailsThatStepNamingIt) {
  constexpr auto kInterval = 50ms;
  Group g(2, kInterval);
  FakeWorker w0(g.group.endpoint(), 0, 2, kInterval);
  std::unique_ptr<FakeWorker> w1;
  WorkerStepFn dying = [&w1](const StepPlan& plan) -> StatusOr<StepResult> {
    if (plan.step_id == 3) {
      w1->link->stop(/*silently=*/true);  // the process "crashes" mid-step
      std::this_thread::sleep_for(400ms);
    }
    return empty_result(plan);
  };
  w1 = std::make_unique<FakeWorker>(g.group.endpoint(), 1, 2, kInterval, dying);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 2, 3);
  const auto t0 = Clock::now();
  StatusOr<StepResult> r = g.group.execute(decode_plan(3, 3));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("rank 1 died during step 3"), std::string::npos) << r.status().to_string();
  EXPECT_LT(Clock::now() - t0, 400ms);  // failed on missed heartbeats, before the step would end
}

TEST(WorkerGroupTest, RankErrorFailsTheStepNamingIt) {
  Group g(2);
  FakeWorker w0(g.group.endpoint(), 0, 2, 100ms);
  WorkerStepFn failing = [](const StepPlan& plan) -> StatusOr<StepResult> {
    if (plan.step_id == 2) return resource_exhausted("KV block 99 out of range");
    return empty_result(plan);
  };
  FakeWorker w1(g.group.endpoint(), 1, 2, 100ms, failing);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 1, 2);
  StatusOr<StepResult> r = g.group.execute(decode_plan(2, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("rank 1 failed step 2"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("KV block 99 out of range"), std::string::npos);
  run_steps(g.group, 2, 2, 3);  // the group is still whole
}

// A rank whose collective broke leaves, and says so in its reply: the group is incomplete
// when execute() returns, though every link is still up and no heartbeat has been missed
// (so that the server reports the workers' outage, 503, not a failed request).
TEST(WorkerGroupTest, RankWhoseCollectiveBrokeIsLostWhenTheStepReturns) {
  Group g(2, 1000ms);  // heartbeats far slower than the step: they cannot be what tells
  FakeWorker w0(g.group.endpoint(), 0, 2, 1000ms);
  WorkerStepFn broken = [](const StepPlan& plan) -> StatusOr<StepResult> {
    if (plan.step_id == 2) return Status(StatusCode::kUnavailable, "all_reduce_sum: missing rank(s) 0");
    return empty_result(plan);
  };
  FakeWorker w1(g.group.endpoint(), 1, 2, 1000ms, broken);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 1, 2);
  ASSERT_TRUE(g.group.is_complete());
  StatusOr<StepResult> r = g.group.execute(decode_plan(2, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("rank 1 failed step 2"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("missing rank(s) 0"), std::string::npos) << r.status().to_string();
  EXPECT_FALSE(g.group.is_complete());
  EXPECT_NE(g.group.status()[1].error.find("left the group after its collective failed in step 2"), std::string::npos)
      << g.group.status()[1].error;
  EXPECT_TRUE(w1.wait_done(5s));  // its link ended the session
  EXPECT_TRUE(w1.result.is_ok()) << w1.result.to_string();
}

TEST(WorkerGroupTest, WrongProtocolVersionIsRejected) {
  Group g(1);
  constexpr uint16_t kOther = wire::kProtocolVersion + 1;
  FakeWorker w(g.group.endpoint(), 0, 1, 100ms, fake_step, nullptr, kOther);
  ASSERT_TRUE(w.wait_done(5s));
  ASSERT_FALSE(w.result.is_ok());
  EXPECT_EQ(w.result.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.result.message().find("wire protocol version " + std::to_string(kOther) +
                                    " rejected: this coordinator speaks version " +
                                    std::to_string(wire::kProtocolVersion)),
            std::string::npos)
      << w.result.to_string();
  EXPECT_FALSE(g.group.status()[0].registered);
}

TEST(WorkerGroupTest, DuplicateRankIsRejected) {
  Group g(2);
  FakeWorker first(g.group.endpoint(), 0, 2, 100ms);
  while (!g.group.status()[0].registered) std::this_thread::sleep_for(1ms);
  FakeWorker second(g.group.endpoint(), 0, 2, 100ms);
  ASSERT_TRUE(second.wait_done(5s));
  ASSERT_FALSE(second.result.is_ok());
  EXPECT_NE(second.result.message().find("duplicate registration for rank 0"), std::string::npos)
      << second.result.to_string();
  EXPECT_EQ(g.group.status()[0].registrations, 1);
  EXPECT_TRUE(g.group.status()[0].alive);
}

TEST(WorkerGroupTest, WrongWorldSizeIsRejected) {
  Group g(2);
  FakeWorker w(g.group.endpoint(), 0, 4, 100ms);
  ASSERT_TRUE(w.wait_done(5s));
  EXPECT_NE(w.result.message().find("registered for world size 4 but this group has 2 ranks"), std::string::npos)
      << w.result.to_string();
}

TEST(WorkerGroupTest, SetupFailureIsReported) {
  Group g(1);
  FakeWorker w(g.group.endpoint(), 0, 1, 100ms, fake_step,
               [](const wire::Assignment&) { return not_found("models/fake/config.json: no such file"); });
  Status st = g.group.wait_until_ready(5s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("rank 0 setup failed: NotFound: models/fake/config.json"), std::string::npos)
      << st.to_string();
  ASSERT_TRUE(w.wait_done(5s));
  EXPECT_EQ(w.result.code(), StatusCode::kNotFound);
}

TEST(WorkerGroupTest, BadBindAddressIsAnError) {
  WorkerGroup group;
  WorkerGroupOptions o;
  o.bind_address = "tcp://not an address";
  Status st = group.start(o, make_assignment);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cannot bind 'tcp://not an address'"), std::string::npos) << st.to_string();
}

TEST(WorkerGroupTest, WorkerLeavesWhenCoordinatorGoesSilent) {
  // A hand-made coordinator that assigns and then never speaks again.
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  FakeWorker w(router.get(zmq::sockopt::last_endpoint), 0, 1, 40ms);
  zmq::message_t id, reg;
  ASSERT_TRUE(router.recv(id));
  ASSERT_TRUE(router.recv(reg));
  wire::Register r;
  ASSERT_TRUE(wire::decode(std::string_view(static_cast<const char*>(reg.data()), reg.size()), &r).is_ok());
  EXPECT_EQ(r.pid, getpid());
  const std::string a = wire::encode(make_assignment(0, r));
  router.send(id, zmq::send_flags::sndmore);
  router.send(zmq::buffer(a));
  const auto t0 = Clock::now();
  ASSERT_TRUE(w.wait_done(3s));
  EXPECT_GE(Clock::now() - t0, 100ms);  // 3 intervals of 40 ms
  EXPECT_EQ(w.result.code(), StatusCode::kUnavailable);
  EXPECT_NE(w.result.message().find("silent for"), std::string::npos) << w.result.to_string();
}

TEST(WorkerGroupTest, HungWorkerProcessIsDeclaredDeadWithinTwoIntervals) {
  constexpr auto kInterval = 50ms;
  const std::string endpoint = fresh_ipc_endpoint();
  const pid_t child = fork_worker_process(endpoint, 1, 2, kInterval);
  ASSERT_GE(child, 0);
  Group g(2, kInterval, endpoint);
  FakeWorker w0(endpoint, 0, 2, kInterval);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  EXPECT_EQ(g.group.status()[1].pid, child);
  run_steps(g.group, 3, 2);

  // A hung process (SIGSTOP): the connection stays open but heartbeats stop.
  kill(child, SIGSTOP);
  const auto t0 = Clock::now();
  while (g.group.status()[1].alive && Clock::now() - t0 < 2s) std::this_thread::sleep_for(1ms);
  const auto detected = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  const RankStatus s1 = g.group.status()[1];
  ASSERT_FALSE(s1.alive);
  EXPECT_NE(s1.error.find("no heartbeat for"), std::string::npos) << s1.error;
  EXPECT_LE(detected.count(), 2 * kInterval.count() + 60) << "took " << detected.count() << " ms";
  StatusOr<StepResult> r = g.group.execute(decode_plan(9, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("rank 1 dead (no heartbeat for"), std::string::npos)
      << r.status().to_string();

  // Woken up, the stale worker is told it was declared dead and leaves (exit code 1).
  kill(child, SIGCONT);
  int wstatus = 0;
  const auto t1 = Clock::now();
  while (waitpid(child, &wstatus, WNOHANG) == 0 && Clock::now() - t1 < 5s) std::this_thread::sleep_for(5ms);
  if (Clock::now() - t1 >= 5s) {
    kill(child, SIGKILL);
    waitpid(child, &wstatus, 0);
    FAIL() << "stale worker did not leave after being declared dead";
  }
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 1);
}

TEST(WorkerGroupTest, KilledWorkerProcessFailsStepsUntilReplaced) {
  constexpr auto kInterval = 50ms;
  const std::string endpoint = fresh_ipc_endpoint();
  const pid_t child = fork_worker_process(endpoint, 1, 2, kInterval);
  ASSERT_GE(child, 0);
  Group g(2, kInterval, endpoint);
  FakeWorker w0(endpoint, 0, 2, kInterval);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 3, 2);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  const auto t0 = Clock::now();
  while (g.group.status()[1].alive && Clock::now() - t0 < 2s) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(g.group.status()[1].alive);
  StatusOr<StepResult> r = g.group.execute(decode_plan(9, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("rank 1 dead"), std::string::npos) << r.status().to_string();
  FakeWorker replacement(endpoint, 1, 2, kInterval);
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  run_steps(g.group, 3, 2, 10);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(WorkerGroupTest, CurveEncryptedLink) {
  if (!zmq_has("curve")) GTEST_SKIP() << "SKIPPED: libzmq built without CURVE";
  char server_public[41] = {}, server_secret[41] = {};
  ASSERT_EQ(zmq_curve_keypair(server_public, server_secret), 0);
  WorkerGroup group;
  WorkerGroupOptions o;
  o.bind_address = "tcp://127.0.0.1:*";
  o.world_size = 1;
  o.heartbeat_interval = 100ms;
  o.curve_server_public_key = server_public;
  o.curve_server_secret_key = server_secret;
  ASSERT_TRUE(group.start(o, make_assignment).is_ok());

  // Without the server key the handshake never completes: no registration.
  WorkerLinkOptions plain;
  plain.coordinator_address = group.endpoint();
  plain.heartbeat_interval = 100ms;
  plain.register_timeout = 300ms;
  WorkerLink plain_link(plain);
  Status st = plain_link.run(nullptr, fake_step);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_FALSE(group.status()[0].registered);

  WorkerLinkOptions secure = plain;
  secure.register_timeout = 5s;
  secure.curve_server_public_key = server_public;
  WorkerLink link(secure);
  std::thread t([&] { st = link.run(nullptr, fake_step); });
  ASSERT_TRUE(group.wait_until_ready(5s).is_ok());
  run_steps(group, 5, 3);
  group.shutdown();
  t.join();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A rank whose setup goes through the collective-id rendezvous, as an NCCL rank's does.
struct IdSharingWorker {
  IdSharingWorker(const std::string& address, int rank, int world, std::chrono::milliseconds wait = 5s) {
    WorkerLinkOptions o;
    o.coordinator_address = address;
    o.rank = rank;
    o.world_size = world;
    o.heartbeat_interval = 100ms;
    o.register_timeout = 5s;
    link = std::make_unique<WorkerLink>(o);
    thread = std::thread([this, rank, wait] {
      result = link->run(
          [this, rank, wait](const wire::Assignment&) -> Status {
            // Every rank publishes another blob first (as worker.collectives auto does), which
            // the others must not take for rank 0's id.
            TESSERA_RETURN_IF_ERROR(link->publish_collective_blob("shm-identity:rank-" + std::to_string(rank)));
            StatusOr<std::string> id = link->share_collective_id(rank == 0 ? "unique-id-of-rank-0" : "", wait);
            if (!id.is_ok()) return id.status();
            got = *id;
            return Status::ok();
          },
          fake_step);
      done = true;
    });
  }
  ~IdSharingWorker() {
    link->stop();
    thread.join();
  }
  std::unique_ptr<WorkerLink> link;
  std::thread thread;
  std::atomic<bool> done{false};
  Status result;
  std::string got;
};

TEST(WorkerGroupTest, RankZerosCollectiveIdReachesEveryRankIncludingLateJoiners) {
  Group g(3);
  auto rank1 = std::make_unique<IdSharingWorker>(g.group.endpoint(), 1, 3);  // waits for rank 0
  std::this_thread::sleep_for(50ms);
  auto rank0 = std::make_unique<IdSharingWorker>(g.group.endpoint(), 0, 3);
  const auto deadline = Clock::now() + 5s;
  while (!(g.group.status()[0].ready && g.group.status()[1].ready) && Clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  auto rank2 = std::make_unique<IdSharingWorker>(g.group.endpoint(), 2, 3);  // joins after the id was made
  ASSERT_TRUE(g.group.wait_until_ready(10s).is_ok());
  EXPECT_EQ(rank0->got, "unique-id-of-rank-0");
  EXPECT_EQ(rank1->got, "unique-id-of-rank-0");
  EXPECT_EQ(rank2->got, "unique-id-of-rank-0");
  run_steps(g.group, 3, 2);
}

TEST(WorkerGroupTest, RankWaitingForACollectiveIdThatNeverComesFailsSetupClearly) {
  Group g(2);
  IdSharingWorker rank1(g.group.endpoint(), 1, 2, 300ms);  // rank 0 never starts
  const auto deadline = Clock::now() + 5s;
  while (!rank1.done && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(rank1.done);
  EXPECT_EQ(rank1.result.code(), StatusCode::kUnavailable) << rank1.result.to_string();
  EXPECT_NE(rank1.result.message().find("no collective id from rank 0"), std::string::npos)
      << rank1.result.to_string();
  while (g.group.status()[1].error.empty() && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_NE(g.group.status()[1].error.find("no collective id"), std::string::npos) << g.group.status()[1].error;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// server.curve.allowed_client_keys_file: the ZAP handler refuses a worker that holds the
// server's public key but not an allowed keypair; the allowed worker still serves.
TEST(WorkerGroupTest, CurveAllowListRefusesUnknownWorkerKeys) {
  if (!zmq_has("curve")) GTEST_SKIP() << "SKIPPED: libzmq built without CURVE";
  char server_public[41] = {}, server_secret[41] = {}, good_public[41] = {}, good_secret[41] = {};
  ASSERT_EQ(zmq_curve_keypair(server_public, server_secret), 0);
  ASSERT_EQ(zmq_curve_keypair(good_public, good_secret), 0);
  WorkerGroup group;
  WorkerGroupOptions o;
  o.bind_address = "tcp://127.0.0.1:*";
  o.world_size = 1;
  o.heartbeat_interval = 100ms;
  o.curve_server_public_key = server_public;
  o.curve_server_secret_key = server_secret;
  o.curve_allowed_client_keys = {good_public};
  ASSERT_TRUE(group.start(o, make_assignment).is_ok());

  // The right server key, but a keypair of its own: refused in the handshake, at once.
  WorkerLinkOptions intruder;
  intruder.coordinator_address = group.endpoint();
  intruder.heartbeat_interval = 100ms;
  intruder.register_timeout = 10s;
  intruder.curve_server_public_key = server_public;
  WorkerLink intruder_link(intruder);
  const auto t0 = std::chrono::steady_clock::now();
  Status st = intruder_link.run(nullptr, fake_step);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "refusal should not wait for register_timeout";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("refused this worker's CURVE key"), std::string::npos) << st.to_string();
  EXPECT_FALSE(group.status()[0].registered);
  EXPECT_GE(group.refused_handshakes(), 1u);

  WorkerLinkOptions good = intruder;
  good.curve_public_key = good_public;
  good.curve_secret_key = good_secret;
  WorkerLink link(good);
  std::thread t([&] { st = link.run(nullptr, fake_step); });
  ASSERT_TRUE(group.wait_until_ready(5s).is_ok());
  run_steps(group, 5, 3);
  group.shutdown();
  t.join();
  EXPECT_TRUE(st.is_ok()) << st.to_string();

  // Keys without CURVE are a mistake, not a silent no-op.
  WorkerGroup plain;
  WorkerGroupOptions p;
  p.bind_address = "tcp://127.0.0.1:*";
  p.curve_allowed_client_keys = {good_public};
  EXPECT_EQ(plain.start(p, make_assignment).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
