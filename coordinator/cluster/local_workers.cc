#include "coordinator/cluster/local_workers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/logging.h"

namespace tessera {

std::string executable_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

Status LocalWorkers::start(const std::string& worker_binary, const std::string& config_path, int world,
                           const std::vector<std::string>& extra_args) {
  if (access(worker_binary.c_str(), X_OK) != 0) {
    return not_found("worker program " + worker_binary + " is missing or not executable");
  }
  binary_ = worker_binary;
  config_ = config_path;
  extra_ = extra_args;
  pids_.assign(world, -1);
  lives_.assign(world, RankLife{});
  for (int r = 0; r < world; ++r) TESSERA_RETURN_IF_ERROR(spawn(r));
  return Status::ok();
}

Status LocalWorkers::spawn(int rank) {
  // Everything the child needs is built before fork(): between fork and exec a child of a
  // multithreaded process may only make async-signal-safe calls (no allocation).
  std::vector<std::string> args = {binary_, "--config", config_, "--rank", std::to_string(rank)};
  args.insert(args.end(), extra_.begin(), extra_.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return internal_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // The parent may block signals it takes with sigwait; the worker must receive them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the parent died before prctl took effect
    // A process group of its own: a terminal's Ctrl-C (or `timeout`'s signal to the group)
    // reaches only the coordinator, which drains with its workers still there and then stops
    // them; the parent-death signal above still ends a worker whose coordinator is gone.
    setpgid(0, 0);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pids_[rank] = pid;
  lives_[rank].started = std::chrono::steady_clock::now();
  lives_[rank].exit_seen = false;
  return Status::ok();
}

Status LocalWorkers::restart(int rank) {
  if (rank < 0 || rank >= static_cast<int>(pids_.size())) return invalid_argument("no rank " + std::to_string(rank));
  if (pids_[rank] > 0) {
    kill(pids_[rank], SIGKILL);
    waitpid(pids_[rank], nullptr, 0);
  }
  return spawn(rank);
}

bool LocalWorkers::running(int rank) {
  pid_t& p = pids_.at(rank);
  if (p <= 0) return false;
  if (waitpid(p, nullptr, WNOHANG) == p) {
    p = -1;
    return false;
  }
  return true;
}

int LocalWorkers::restart_exited() {
  int n = 0;
  const auto now = std::chrono::steady_clock::now();
  for (int r = 0; r < static_cast<int>(pids_.size()); ++r) {
    if (running(r)) continue;
    RankLife& life = lives_[r];
    if (!life.exit_seen) {
      life.exit_seen = true;
      const auto lived = std::chrono::duration_cast<std::chrono::milliseconds>(now - life.started);
      life.backoff = lived >= kSteadyRun ? std::chrono::milliseconds(0)
                                         : std::clamp(2 * life.backoff, kFirstBackoff, kMaxBackoff);
      life.next_start = now + life.backoff;
      if (life.backoff > std::chrono::milliseconds(0)) {
        TESSERA_LOG_WARN("rank {}'s worker exited {} ms after it started: starting it again in {} ms", r,
                         lived.count(), life.backoff.count());
      }
    }
    if (now < life.next_start) continue;
    if (spawn(r).is_ok()) ++n;
  }
  return n;
}

void LocalWorkers::stop(int grace_ms) {
  for (pid_t p : pids_) {
    if (p <= 0) continue;
    kill(p, SIGTERM);
    kill(p, SIGCONT);  // a stopped worker (SIGSTOP, a debugger) acts on the SIGTERM only once continued
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  for (pid_t& p : pids_) {
    while (p > 0) {
      if (waitpid(p, nullptr, WNOHANG) == p) {
        p = -1;
      } else if (std::chrono::steady_clock::now() > deadline) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        p = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  pids_.clear();
}

}  // namespace tessera
