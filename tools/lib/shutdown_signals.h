#pragma once
// SIGTERM and SIGINT for the serving process, taken on a thread of their own at any point of
// its life: during set-up (model load, worker start, KV sizing) a signal cancels what is
// being waited for; once serving, the first signal starts the drain and a second one cuts it
// short. The process decides what a signal means by the handler it sets for each phase.
//
// Constructed before any other thread exists: it blocks both signals in the calling thread,
// so every thread made later inherits the mask and none dies of the default action; a
// signalfd hands them to the watching thread.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace tessera {

class ShutdownSignals {
 public:
  // `count` is 1 for the first signal, 2 for the second, ...
  using Handler = std::function<void(int signal, int count)>;

  ShutdownSignals();
  ~ShutdownSignals();  // stops watching; the signals stay blocked
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  // Runs on the watching thread at every signal from now on (after requested() is set).
  // Returns once a handler that was running has returned, so what the old one used may go.
  void set_handler(Handler handler);
  // A signal has arrived (the first one's number in signal(); 0 before).
  bool requested() const { return first_signal_.load() != 0; }
  int signal() const { return first_signal_.load(); }
  // Blocks until a signal has arrived.
  void wait();

 private:
  void watch();

  int signal_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: wakes the watcher to end
  std::atomic<int> first_signal_{0};
  int count_ = 0;  // watcher thread only
  std::mutex handler_mu_;  // held while the handler runs
  Handler handler_;
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  std::thread watcher_;
};

}  // namespace tessera
