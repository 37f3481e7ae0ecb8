#include "tools/loadgen/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace tessera::loadgen {

ProgressBar::ProgressBar(std::string label, int total, double duration_s, const Progress& progress, bool enabled)
    : label_(std::move(label)),
      total_(total),
      duration_s_(duration_s),
      progress_(progress),
      enabled_(enabled && isatty(STDERR_FILENO) != 0) {
  if (!enabled_) return;
  thread_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
  });
}

ProgressBar::~ProgressBar() { stop(); }

void ProgressBar::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

void ProgressBar::draw(double elapsed_s) {
  const int ok = progress_.ok, failed = progress_.failed, issued = progress_.issued;
  const int finished = ok + failed;
  double fraction = 0;
  if (total_ > 0) fraction = static_cast<double>(finished) / total_;
  if (duration_s_ > 0) fraction = std::max(fraction, std::min(1.0, elapsed_s / duration_s_));
  constexpr int kWidth = 30;
  const int filled = std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(kWidth - filled), '.');
  const double tok_s = elapsed_s > 0 ? static_cast<double>(progress_.output_tokens.load()) / elapsed_s : 0;
  std::string of;
  if (total_ > 0) of.append(1, '/').append(std::to_string(total_));
  std::fprintf(stderr, "\r\033[K%s [%s] %d%s done, %d in flight, %d failed, %.0f tok/s, %.1f s", label_.c_str(),
               bar.c_str(), finished, of.c_str(), issued - finished, failed, tok_s, elapsed_s);
  std::fflush(stderr);
}

}  // namespace tessera::loadgen
