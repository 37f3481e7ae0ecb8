#include "tools/lib/shutdown_signals.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "common/logging.h"

namespace tessera {

ShutdownSignals::ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal_fd_ = signalfd(-1, &signals, SFD_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (signal_fd_ < 0 || stop_fd_ < 0) {
    // Without them the signals stay blocked and pending: the process would not stop. Better
    // to keep the default action (die at once) than to be unkillable by SIGTERM.
    TESSERA_LOG_ERROR("cannot watch SIGTERM/SIGINT (signalfd/eventfd failed, errno {}): they kill at once",
                      errno);
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    return;
  }
  watcher_ = std::thread([this] { watch(); });
}

ShutdownSignals::~ShutdownSignals() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof(one));
    watcher_.join();
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void ShutdownSignals::set_handler(Handler handler) {
  std::lock_guard<std::mutex> lock(handler_mu_);
  handler_ = std::move(handler);
}

void ShutdownSignals::wait() {
  std::unique_lock<std::mutex> lock(wait_mu_);
  wait_cv_.wait(lock, [this] { return requested(); });
}

void ShutdownSignals::watch() {
  pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      TESSERA_LOG_ERROR("watching SIGTERM/SIGINT: poll failed (errno {})", errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    signalfd_siginfo info{};
    if (::read(signal_fd_, &info, sizeof(info)) != static_cast<ssize_t>(sizeof(info))) continue;
    const int sig = static_cast<int>(info.ssi_signo);
    ++count_;
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      int none = 0;
      first_signal_.compare_exchange_strong(none, sig);
    }
    wait_cv_.notify_all();
    std::lock_guard<std::mutex> lock(handler_mu_);
    if (handler_) handler_(sig, count_);
  }
}

}  // namespace tessera
