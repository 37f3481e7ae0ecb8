#pragma once
// Worker processes started by this process on this host (tessera-serve, and
// tessera-generate --tensor-parallel): one `tessera-worker --config FILE --rank R` per rank.
// Children die with their parent (PR_SET_PDEATHSIG), so a crashed coordinator leaves no
// orphans; stop() asks them to exit (SIGTERM), then kills stragglers.
#include <sys/types.h>

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
  // them must come back for the group to be whole.
  int restart_exited();
  // SIGTERM, wait up to `grace_ms`, then SIGKILL; reaps every child.
  void stop(int grace_ms = 3000);

 private:
  Status spawn(int rank);

  std::string binary_, config_;
  std::vector<std::string> extra_;
  std::vector<pid_t> pids_;
};

// Folder of the running executable (to find tessera-worker beside tessera-serve).
std::string executable_dir();

}  // namespace tessera
