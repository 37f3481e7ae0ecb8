#pragma once
// Worker processes started by this process on this host (tessera-serve, and
// tessera-generate --tensor-parallel): one `tessera-worker --config FILE --rank R` per rank.
// Children die with their parent (PR_SET_PDEATHSIG), so a crashed coordinator leaves no
// orphans; stop() asks them to exit (SIGTERM), then kills stragglers.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

class LocalWorkers {
 public:
  LocalWorkers() = default;
  ~LocalWorkers() { stop(); }
  LocalWorkers(const LocalWorkers&) = delete;
  LocalWorkers& operator=(const LocalWorkers&) = delete;

  // Starts ranks 0..world-1 of `worker_binary` with `config_path` (+ extra arguments).
  Status start(const std::string& worker_binary, const std::string& config_path, int world,
               const std::vector<std::string>& extra_args = {});
  // Starts one rank again (after it died).
  Status restart(int rank);
  pid_t pid(int rank) const { return pids_.at(rank); }
  // Whether rank's process is still running (reaps it when it has exited).
  bool running(int rank);
  // Restarts every rank whose process exited; returns how many. A supervisor calls this
  // periodically: a rank whose peer died leaves too (its collectives fail), and all of
  // them must come back for the group to be whole. A rank whose process ran less than
  // kSteadyRun waits before it starts again, twice as long each time it does so again
  // (kFirstBackoff up to kMaxBackoff): a worker that cannot start (a refused registration, a
  // model that fails to load) is not started 20 times a second.
  int restart_exited();
  static constexpr std::chrono::milliseconds kSteadyRun{10000};
  static constexpr std::chrono::milliseconds kFirstBackoff{100};
  static constexpr std::chrono::milliseconds kMaxBackoff{5000};
  // SIGTERM, wait up to `grace_ms`, then SIGKILL; reaps every child.
  void stop(int grace_ms = 3000);

 private:
  Status spawn(int rank);

  std::string binary_, config_;
  std::vector<std::string> extra_;
  std::vector<pid_t> pids_;
  struct RankLife {
    std::chrono::steady_clock::time_point started, next_start;
    std::chrono::milliseconds backoff{0};
    bool exit_seen = false;  // its exit has set next_start
  };
  std::vector<RankLife> lives_;
};

// Folder of the running executable (to find tessera-worker beside tessera-serve).
std::string executable_dir();

}  // namespace tessera
