#pragma once
// Faults in the CPU KV pool's pages a little ahead of the blocks in use, on a background
// thread at a low priority (nice 10), so no step pays for first touches.
//
// Why: the pool's pages are mapped lazily (a large pool takes no memory until used, see
// Tensor::zeros), and with prefix caching on, every new sequence takes blocks no one has
// written before (the cached ones are kept for reuse). A first touch is expensive on a VM:
// 3.3-3.5 ms per 2 MiB huge page and 12 µs per 4 KiB page (bench/page_touch.py), so a step whose KV
// writes crossed into fresh huge pages in each of the ~100M model's 24 K/V pools stalled
// for ~40 ms, and such steps set the p99 time to first token at 1 request/s. Blocks are
// handed out in ascending order until the pool has been used once (BlockManager), so "ahead"
// is the next blocks by index.
//
// Pages are populated with madvise(MADV_POPULATE_WRITE), which touches no contents, so it is
// safe while steps write KV in the same pages. On kernels without it (before 5.14) nothing
// is prefaulted and first touches happen in steps, as before.
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

class KvPrefaulter {
 public:
  // One region per pool tensor, each num_blocks × block_bytes (a block's K or V in one layer).
  struct Region {
    char* base = nullptr;
    size_t block_bytes = 0;
  };
  KvPrefaulter(std::vector<Region> regions, int num_blocks);
  ~KvPrefaulter();
  KvPrefaulter(const KvPrefaulter&) = delete;
  KvPrefaulter& operator=(const KvPrefaulter&) = delete;

  // From construction on, the first ahead_blocks() are populated (a first step's).
  // Blocks below `end` are in use: populate up to `end` plus the margin ahead.
  void in_use_below(int end);
  // How many blocks (from 0) have been populated; for tests.
  int populated_blocks() const;
  // Blocks kept populated beyond the highest in use: 2 MiB of the largest region's blocks
  // (one huge page per pool tensor), at least 16.
  int ahead_blocks() const { return ahead_; }

 private:
  void run();

  const std::vector<Region> regions_;
  const int num_blocks_;
  int ahead_ = 16;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int target_ = 0;     // populate blocks [0, target_)
  int populated_ = 0;  // blocks [0, populated_) are
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera
