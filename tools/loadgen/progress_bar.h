#pragma once
// A one-line progress bar on stderr while a run goes on (only when stderr is a terminal):
// requests done of the total (or time of the duration), successes, failures, tokens/s.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "tools/loadgen/runner.h"

namespace tessera::loadgen {

class ProgressBar {
 public:
  // total = requests (0 = unknown), duration_s = limit (0 = none).
  ProgressBar(std::string label, int total, double duration_s, const Progress& progress, bool enabled);
  ~ProgressBar();  // stop()
  void stop();     // clears the line

 private:
  void draw(double elapsed_s);
  std::string label_;
  int total_;
  double duration_s_;
  const Progress& progress_;
  bool enabled_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera::loadgen
