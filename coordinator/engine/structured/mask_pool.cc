#include "coordinator/engine/structured/mask_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"

namespace tessera::structured {

// One job at a time: published under `mu` with a new generation number; the helpers that take
// part (the first `participants`) claim indices from `next` and report back through `busy`.
// The caller waits for busy == 0 before returning, so `fn` outlives every use of it.
struct MaskPool::Shared {
  std::mutex run_mu;  // one run() at a time
  std::mutex mu;
  std::condition_variable wake, done;
  std::vector<std::thread> helpers;
  uint64_t generation = 0;
  int participants = 0;
  int busy = 0;
  bool stop = false;
  const std::function<void(size_t)>* fn = nullptr;
  size_t n = 0;
  std::atomic<size_t> next{0};

  void drain() {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) (*fn)(i);
  }

  void helper(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      if (index >= participants) continue;  // not needed for this job
      lock.unlock();
      drain();
      lock.lock();
      if (--busy == 0) done.notify_one();
    }
  }
};

int MaskPool::default_threads() {
  const int fallback = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  if (const char* env = std::getenv("TESSERA_MASK_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end == '\0' && v >= 1 && v <= 64) return static_cast<int>(v);
    TESSERA_LOG_WARN("TESSERA_MASK_THREADS={} is not a whole number from 1 to 64; using {}", env, fallback);
  }
  return fallback;
}

MaskPool::MaskPool(int threads) : threads_(std::max(1, threads)), shared_(std::make_unique<Shared>()) {}

MaskPool::~MaskPool() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;
  }
  shared_->wake.notify_all();
  for (std::thread& t : shared_->helpers) t.join();
}

void MaskPool::run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (threads_ == 1 || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Shared& s = *shared_;
  std::lock_guard<std::mutex> one_run(s.run_mu);
  if (s.helpers.empty()) {
    for (int i = 0; i + 1 < threads_; ++i) s.helpers.emplace_back([&s, i] { s.helper(i); });
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.fn = &fn;
    s.n = n;
    s.next.store(0);
    s.participants = static_cast<int>(std::min(n - 1, s.helpers.size()));
    s.busy = s.participants;
    ++s.generation;
  }
  s.wake.notify_all();
  s.drain();
  std::unique_lock<std::mutex> lock(s.mu);
  s.done.wait(lock, [&] { return s.busy == 0; });
  s.fn = nullptr;
}

}  // namespace tessera::structured
