// One suite for every Communicator: loopback (world 1), shared memory (world 1-4) and Gloo
// over loopback TCP (world 1-3), each rank a real process (fork) that opens its own
// communicator by name, as workers do.
// Children never use gtest assertions (their failures would die with them): a child
// writes one report line to a pipe ("ok <digest>" or "FAIL <why>") and exits; the parent
// asserts on exit codes and reports, including that every rank produced the same bytes.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common/communicator.h"
#include "common/dtype.h"
#include "worker/gloo_communicator.h"
#include "worker/shm_communicator.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct CommImpl {
  std::string kind;  // "loopback", "shm" or "gloo"
  int world;
};

// Readable names in ctest and failure messages instead of the object's bytes.
void PrintTo(const CommImpl& impl, std::ostream* os) { *os << impl.kind << " world " << impl.world; }

std::string impl_label(const ::testing::TestParamInfo<CommImpl>& info) {
  return info.param.kind + "_world" + std::to_string(info.param.world);
}

std::string fresh_group() {
  static int counter = 0;
  return "ct" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// The folder where a Gloo group's ranks meet (removed by run_ranks when they are done).
std::string gloo_rendezvous_dir(const std::string& group) { return ::testing::TempDir() + "tessera-gloo-" + group; }

struct RunOptions {
  size_t max_bytes = 64 * 1024;  // small, so MB-sized messages are chunked
  int timeout_ms = 10000;
  int delay_rank0_ms = 0;  // start the other ranks first (they may meet a stale segment)
};

struct RankOutcome {
  int exit_code = -1;  // -1: killed by a signal or by the watchdog
  std::string report;
};

StatusOr<std::unique_ptr<Communicator>> open_comm(const CommImpl& impl, const std::string& group, int rank,
                                                  const RunOptions& o) {
  if (impl.kind == "loopback") return make_loopback_communicator();
  if (impl.kind == "gloo") {
    GlooOptions g;
    g.rank = rank;
    g.world_size = impl.world;
    g.address = "127.0.0.1";
    g.timeout_ms = o.timeout_ms;
    return make_gloo_communicator(g, *make_folder_rendezvous(gloo_rendezvous_dir(group)));
  }
  return make_shm_communicator(group, rank, impl.world, o.max_bytes, o.timeout_ms);
}

// Body of one rank: returns "" on success or a failure description; may append to `digest`.
using RankBody = std::function<std::string(Communicator& comm, int rank, std::string& digest)>;

// Forks impl.world children; child r opens its communicator and runs body. Children that
// outlive `watchdog` are killed, so a hang fails the test instead of stalling the suite.
std::vector<RankOutcome> run_ranks(const CommImpl& impl, const RankBody& body, const RunOptions& o = {},
                                   const std::string& group_in = "") {
  const std::string group = group_in.empty() ? fresh_group() : group_in;
  std::vector<pid_t> pids(impl.world);
  std::vector<int> fds(impl.world);
  for (int r = 0; r < impl.world; ++r) {
    int p[2];
    if (::pipe(p) != 0) std::abort();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      if (r == 0 && o.delay_rank0_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.delay_rank0_ms));
      std::string report;
      int code = 0;
      {
        auto comm = open_comm(impl, group, r, o);
        if (!comm.is_ok()) {
          report = "FAIL open: " + comm.status().to_string();
          code = 2;
        } else {
          std::string digest;
          std::string err = body(**comm, r, digest);
          if (!err.empty()) {
            report = "FAIL " + err;
            code = 1;
          } else {
            report = "ok " + digest;
          }
        }
      }
      ssize_t unused = ::write(p[1], report.data(), report.size());
      (void)unused;
      ::close(p[1]);
      ::_exit(code);
    }
    ::close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  std::vector<RankOutcome> out(impl.world);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  int remaining = impl.world;
  std::vector<bool> done(impl.world, false);
  while (remaining > 0) {
    for (int r = 0; r < impl.world; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        out[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
    }
    if (remaining > 0 && Clock::now() > deadline) {
      for (int r = 0; r < impl.world; ++r)
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          done[r] = true;
          out[r].report = "FAIL watchdog: rank hung";
        }
      break;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (impl.kind == "gloo") std::filesystem::remove_all(gloo_rendezvous_dir(group));
  for (int r = 0; r < impl.world; ++r) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[r], buf, sizeof(buf))) > 0) out[r].report.append(buf, static_cast<size_t>(n));
    ::close(fds[r]);
  }
  return out;
}

// Every rank exited 0 and reported the same digest.
void expect_all_ok_and_identical(const std::vector<RankOutcome>& out) {
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ": " << out[r].report;
    EXPECT_EQ(out[r].report.rfind("ok", 0), 0u) << "rank " << r << ": " << out[r].report;
    EXPECT_EQ(out[r].report, out[0].report) << "rank " << r << " produced different bytes than rank 0";
  }
}

// ---- deterministic inputs and independent references ------------------------------------

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Magnitudes spread over 2^-8..2^7 so the order of summation shows in the low bits.
float input_value(int rank, int64_t i, uint64_t salt) {
  const uint64_t h = mix((static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(i) << 8) ^ salt);
  const float unit = static_cast<float>(static_cast<int64_t>(h % 200001) - 100000) / 100000.0f;
  return std::ldexp(unit, static_cast<int>((h >> 24) % 16) - 8);
}

std::vector<float> f32_input(int rank, int64_t n, uint64_t salt) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = input_value(rank, i, salt);
  return v;
}

std::vector<uint16_t> bf16_input(int rank, int64_t n, uint64_t salt) {
  std::vector<uint16_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = f32_to_bf16(input_value(rank, i, salt));
  return v;
}

std::vector<float> f32_reference(int world, int64_t n, uint64_t salt) {
  std::vector<float> sum = f32_input(0, n, salt);
  for (int r = 1; r < world; ++r) {
    std::vector<float> x = f32_input(r, n, salt);
    for (int64_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  return sum;
}

std::vector<uint16_t> bf16_reference(int world, int64_t n, uint64_t salt) {
  std::vector<float> acc(n, 0.0f);
  for (int r = 0; r < world; ++r) {
    std::vector<uint16_t> x = bf16_input(r, n, salt);
    for (int64_t i = 0; i < n; ++i) acc[i] = r == 0 ? bf16_to_f32(x[i]) : acc[i] + bf16_to_f32(x[i]);
  }
  std::vector<uint16_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(acc[i]);
  return out;
}

std::string hex_digest(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

template <typename T>
std::string first_mismatch(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0) return "";
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0)
      return what + ": element " + std::to_string(i) + " of " + std::to_string(got.size()) + " differs";
  return what + ": differs";
}

// 1, 7, 1000 (one small step), 12,000 f32 = 48 KB (one step, slice-reduced) and ~3 MB
// (48 chunks of 64 KB plus a ragged tail).
const std::vector<int64_t> kSizes = {1, 7, 1000, 12000, 3 * 256 * 1024 + 13};

class CommunicatorTest : public ::testing::TestWithParam<CommImpl> {};

TEST_P(CommunicatorTest, ReportsRankAndWorld) {
  const CommImpl impl = GetParam();
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string&) -> std::string {
    if (c.rank() != rank) return "rank() " + std::to_string(c.rank()) + " != " + std::to_string(rank);
    if (c.world_size() != impl.world) return "world_size() " + std::to_string(c.world_size());
    if (c.name() != impl.kind) return "name() " + c.name();
    return "";
  }));
}

TEST_P(CommunicatorTest, AllReduceF32EqualsRankOrderedSum) {
  const CommImpl impl = GetParam();
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string& digest) -> std::string {
    for (int64_t n : kSizes) {
      std::vector<float> data = f32_input(rank, n, n);
      Status s = c.all_reduce_sum(data.data(), n, DType::kF32);
      if (!s.is_ok()) return s.to_string();
      std::string err = first_mismatch(data, f32_reference(impl.world, n, n), "f32 n=" + std::to_string(n));
      if (!err.empty()) return err;
      digest += hex_digest(data.data(), n * sizeof(float)) + " ";
    }
    return "";
  }));
}

TEST_P(CommunicatorTest, AllReduceBf16SumsInF32AndRoundsOnce) {
  const CommImpl impl = GetParam();
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string& digest) -> std::string {
    for (int64_t n : kSizes) {
      std::vector<uint16_t> data = bf16_input(rank, n, n + 99);
      Status s = c.all_reduce_sum(data.data(), n, DType::kBF16);
      if (!s.is_ok()) return s.to_string();
      std::string err = first_mismatch(data, bf16_reference(impl.world, n, n + 99), "bf16 n=" + std::to_string(n));
      if (!err.empty()) return err;
      digest += hex_digest(data.data(), n * sizeof(uint16_t)) + " ";
    }
    return "";
  }));
}

TEST_P(CommunicatorTest, AllGatherConcatenatesInRankOrder) {
  const CommImpl impl = GetParam();
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string& digest) -> std::string {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{300001}}) {
      std::vector<float> mine = f32_input(rank, n, 7 * n);
      std::vector<float> want;
      for (int r = 0; r < impl.world; ++r) {
        std::vector<float> part = f32_input(r, n, 7 * n);
        want.insert(want.end(), part.begin(), part.end());
      }
      std::vector<float> got(n * impl.world, -1.0f);
      Status s = c.all_gather(mine.data(), got.data(), n, DType::kF32);
      if (!s.is_ok()) return s.to_string();
      std::string err = first_mismatch(got, want, "all_gather n=" + std::to_string(n));
      if (!err.empty()) return err;
      // In place: this rank's part already sits at its offset in recv.
      std::vector<float> inplace(n * impl.world, -1.0f);
      std::copy(mine.begin(), mine.end(), inplace.begin() + rank * n);
      s = c.all_gather(inplace.data() + rank * n, inplace.data(), n, DType::kF32);
      if (!s.is_ok()) return s.to_string();
      err = first_mismatch(inplace, want, "in-place all_gather n=" + std::to_string(n));
      if (!err.empty()) return err;
      digest += hex_digest(got.data(), got.size() * sizeof(float)) + " ";
    }
    return "";
  }));
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  const CommImpl impl = GetParam();
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string& digest) -> std::string {
    for (int root = 0; root < impl.world; ++root) {
      for (int64_t n : {int64_t{7}, int64_t{1000}, int64_t{260000}}) {  // 1 MB: chunked at world <= 3
        std::vector<float> data = f32_input(rank, n, 31 * n + root);
        Status s = c.broadcast(data.data(), n, DType::kF32, root);
        if (!s.is_ok()) return s.to_string();
        std::string err = first_mismatch(data, f32_input(root, n, 31 * n + root),
                                         "broadcast root " + std::to_string(root) + " n=" + std::to_string(n));
        if (!err.empty()) return err;
        digest += hex_digest(data.data(), n * sizeof(float)) + " ";
      }
    }
    Status bad = c.broadcast(nullptr, 0, DType::kF32, impl.world);
    if (bad.code() != StatusCode::kInvalidArgument) return "root out of range gave " + bad.to_string();
    return "";
  }));
}

TEST_P(CommunicatorTest, BarrierHoldsEveryRankUntilAllArrive) {
  const CommImpl impl = GetParam();
  constexpr int kRounds = 50;
  // Counters shared by the children (mapped before fork); each rank bumps the round's
  // counter before the barrier and must see all `world` bumps after it.
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* counters = static_cast<std::atomic<int>*>(mem);
  for (int i = 0; i < kRounds; ++i) new (&counters[i]) std::atomic<int>(0);
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string&) -> std::string {
    for (int round = 0; round < kRounds; ++round) {
      if (rank == round % impl.world) std::this_thread::sleep_for(std::chrono::microseconds(200));
      counters[round].fetch_add(1);
      Status s = c.barrier();
      if (!s.is_ok()) return s.to_string();
      int seen = counters[round].load();
      if (seen != impl.world) return "round " + std::to_string(round) + ": passed the barrier with " +
                                     std::to_string(seen) + " arrivals";
    }
    return "";
  }));
  ::munmap(mem, 4096);
}

TEST_P(CommunicatorTest, ThousandSmallAllReducesBackToBack) {
  const CommImpl impl = GetParam();
  expect_all_ok_and_identical(run_ranks(impl, [&](Communicator& c, int rank, std::string& digest) -> std::string {
    constexpr int64_t kN = 768;  // one decode token's hidden state
    std::vector<float> want(kN);
    uint64_t h = 0;
    for (int round = 0; round < 1000; ++round) {
      // Every rank's contribution is its rank + round, so a rank reading a slot from the
      // wrong step (a generation race) gets a visibly wrong sum.
      std::vector<float> data(kN);
      for (int64_t i = 0; i < kN; ++i) data[i] = static_cast<float>(rank * 1000 + round) + static_cast<float>(i);
      Status s = c.all_reduce_sum(data.data(), kN, DType::kF32);
      if (!s.is_ok()) return "round " + std::to_string(round) + ": " + s.to_string();
      for (int64_t i = 0; i < kN; ++i) {
        float sum = 0.0f;
        for (int r = 0; r < impl.world; ++r) sum += static_cast<float>(r * 1000 + round) + static_cast<float>(i);
        want[i] = sum;
      }
      std::string err = first_mismatch(data, want, "round " + std::to_string(round));
      if (!err.empty()) return err;
      if (round % 100 == 0) {  // mix in the other collectives
        if (!(s = c.barrier()).is_ok()) return s.to_string();
        std::vector<float> g(impl.world);
        float one = static_cast<float>(rank);
        if (!(s = c.all_gather(&one, g.data(), 1, DType::kF32)).is_ok()) return s.to_string();
        for (int r = 0; r < impl.world; ++r)
          if (g[r] != static_cast<float>(r)) return "all_gather in round " + std::to_string(round);
      }
      h = h * 31 + static_cast<uint64_t>(data[kN - 1]);
    }
    digest = std::to_string(h);
    return "";
  }));
}

TEST_P(CommunicatorTest, PeerThatDiesMakesOthersFailNotHang) {
  const CommImpl impl = GetParam();
  if (impl.world < 2) GTEST_SKIP() << "needs a peer";
  // crash: _exit without closing; close: destroys its communicator and exits; stall: stays
  // alive but never calls (only the timeout can tell).
  for (const std::string mode : {"crash", "close", "stall"}) {
    RunOptions o;
    o.timeout_ms = 1000;
    const int victim = impl.world - 1;
    const Clock::time_point start = Clock::now();
    auto out = run_ranks(
        impl,
        [&](Communicator& c, int rank, std::string& digest) -> std::string {
          if (Status s = c.barrier(); !s.is_ok()) return "first barrier: " + s.to_string();
          if (rank == victim) {
            if (mode == "crash") ::_exit(0);
            if (mode == "stall") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            return "";
          }
          const Clock::time_point t0 = Clock::now();
          std::vector<float> data(1000, 1.0f);
          Status s = c.all_reduce_sum(data.data(), 1000, DType::kF32);
          const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
          if (s.is_ok()) return "all_reduce succeeded without rank " + std::to_string(victim);
          if (s.code() != StatusCode::kUnavailable) return "wrong code: " + s.to_string();
          if (s.message().find("all_reduce_sum") == std::string::npos ||
              s.message().find("missing rank(s) " + std::to_string(victim)) == std::string::npos)
            return "message does not name the collective and rank: " + s.message();
          if (waited > 3.0) return "gave up only after " + std::to_string(waited) + " s";
          // The communicator stays failed rather than desynchronised.
          if (c.barrier().is_ok()) return "barrier after failure succeeded";
          digest = "failed as expected";
          return "";
        },
        o);
    for (int r = 0; r < impl.world; ++r) {
      EXPECT_EQ(out[r].exit_code, 0) << mode << ": rank " << r << ": " << out[r].report;
      if (r != victim) {
        EXPECT_EQ(out[r].report, "ok failed as expected") << mode << ": rank " << r;
      }
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0) << mode;
  }
}

TEST_P(CommunicatorTest, StaleSegmentOfACrashedRunIsReplaced) {
  const CommImpl impl = GetParam();
  if (impl.kind != "shm") GTEST_SKIP() << "no segment to go stale";
  const std::string group = fresh_group();
  const std::string name = shm_segment_name(group);
  // Stale 1: garbage under the group's name.
  int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  std::string junk(64 * 1024, '\x5a');
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  RunOptions o;
  o.delay_rank0_ms = 100;
  o.timeout_ms = 5000;
  auto body = [&](Communicator& c, int rank, std::string& digest) -> std::string {
    std::vector<float> data = f32_input(rank, 1000, 5);
    Status s = c.all_reduce_sum(data.data(), 1000, DType::kF32);
    if (!s.is_ok()) return s.to_string();
    digest = hex_digest(data.data(), data.size() * sizeof(float));
    return first_mismatch(data, f32_reference(impl.world, 1000, 5), "after stale garbage");
  };
  expect_all_ok_and_identical(run_ranks(impl, body, o, group));

  // Stale 2: a real, initialised segment whose rank 0 was killed while waiting for peers.
  if (impl.world >= 2) {
    pid_t crashed = ::fork();
    if (crashed == 0) {
      auto c = make_shm_communicator(group, 0, impl.world, o.max_bytes, 60000);
      ::_exit(3);
    }
    // Wait until the crashed run's segment exists, then kill its rank 0.
    for (int i = 0; i < 2000; ++i) {
      int probe = ::shm_open(name.c_str(), O_RDONLY, 0);
      if (probe >= 0) {
        ::close(probe);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::kill(crashed, SIGKILL);
    ::waitpid(crashed, nullptr, 0);
    expect_all_ok_and_identical(run_ranks(impl, body, o, group));
  }
  // Nothing is left under the name afterwards.
  int left = ::shm_open(name.c_str(), O_RDONLY, 0);
  EXPECT_LT(left, 0) << name << " was not unlinked";
  if (left >= 0) {
    ::close(left);
    ::shm_unlink(name.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(AllImplementations, CommunicatorTest,
                         ::testing::Values(CommImpl{"loopback", 1}, CommImpl{"shm", 1}, CommImpl{"shm", 2},
                                           CommImpl{"shm", 3}, CommImpl{"shm", 4}, CommImpl{"gloo", 1},
                                           CommImpl{"gloo", 2}, CommImpl{"gloo", 3}),
                         impl_label);

// ---- shm set-up errors -------------------------------------------------------------------

TEST(ShmCommunicator, RejectsBadArguments) {
  EXPECT_EQ(make_shm_communicator("g", 2, 2, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_shm_communicator("g", -1, 2, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_shm_communicator("g", 0, 0, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_shm_communicator("a/b", 0, 1, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_shm_communicator("", 0, 1, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_shm_communicator("g", 0, 1, 8).status().code(), StatusCode::kInvalidArgument);
}

TEST(ShmCommunicator, RejectsUnsupportedReduceType) {
  auto comm = make_shm_communicator(fresh_group(), 0, 1, 4096);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  int32_t x[4] = {1, 2, 3, 4};
  EXPECT_EQ((*comm)->all_reduce_sum(x, 4, DType::kI32).code(), StatusCode::kInvalidArgument);
}

TEST(ShmCommunicator, WorldSizeMismatchIsAClearError) {
  const std::string group = fresh_group();
  RunOptions o;
  o.timeout_ms = 1500;
  // Rank 0 believes in a world of 2; rank 1 was started with 3.
  pid_t rank0 = ::fork();
  if (rank0 == 0) {
    auto c = make_shm_communicator(group, 0, 2, o.max_bytes, o.timeout_ms);
    ::_exit(c.is_ok() ? 0 : 4);
  }
  auto c = make_shm_communicator(group, 1, 3, o.max_bytes, o.timeout_ms);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().to_string();
  EXPECT_NE(c.status().message().find("world size 2"), std::string::npos) << c.status().to_string();
  int st = 0;
  ::waitpid(rank0, &st, 0);
  EXPECT_EQ(WEXITSTATUS(st), 4) << "rank 0 should time out waiting for its missing peer";
  ::shm_unlink(shm_segment_name(group).c_str());
}

TEST(ShmCommunicator, MissingPeerAtStartupTimesOut) {
  const Clock::time_point start = Clock::now();
  auto c = make_shm_communicator(fresh_group(), 0, 2, 4096, 200);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("rank(s) 1"), std::string::npos) << c.status().to_string();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.0);
}

// ---- Gloo set-up errors ------------------------------------------------------------------

TEST(GlooCommunicator, RejectsBadArgumentsAndNamesAnAddressItCannotListenOn) {
  const std::string dir = gloo_rendezvous_dir(fresh_group());
  auto rendezvous = make_folder_rendezvous(dir);
  GlooOptions g;
  g.rank = 2;
  g.world_size = 2;
  EXPECT_EQ(make_gloo_communicator(g, *rendezvous).status().code(), StatusCode::kInvalidArgument);
  g.rank = 0;
  g.address = "192.0.2.1";  // TEST-NET-1: no interface here has it
  auto c = make_gloo_communicator(g, *rendezvous);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("cannot listen on address 192.0.2.1: Cannot assign requested address"),
            std::string::npos)
      << c.status().to_string();
  g.address.clear();
  g.interface = "no-such-if0";
  c = make_gloo_communicator(g, *rendezvous);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("cannot listen on interface no-such-if0: no such network interface"), std::string::npos)
      << c.status().to_string();
  std::filesystem::remove_all(dir);
}

TEST(GlooCommunicator, MissingPeerAtStartupTimesOutNamingItsKey) {
  const std::string dir = gloo_rendezvous_dir(fresh_group());
  const Clock::time_point start = Clock::now();
  GlooOptions g;
  g.world_size = 2;
  g.address = "127.0.0.1";
  g.timeout_ms = 300;
  auto c = make_gloo_communicator(g, *make_folder_rendezvous(dir));
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().to_string();
  EXPECT_NE(c.status().message().find("could not connect to its peers"), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("rank 1 did not join within 300 ms"), std::string::npos) << c.status().to_string();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 3.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
