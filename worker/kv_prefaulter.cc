#include "worker/kv_prefaulter.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "common/tensor.h"  // kHugePageBytes

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (older glibc headers lack the name)
#endif

namespace tessera {
namespace {

// Populates the whole pages of [begin, end); false when the kernel refuses the advice.
bool populate(char* begin, char* end) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(end) + page - 1) / page * page;
  if (last <= first) return true;
  return ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) == 0;
}

}  // namespace

KvPrefaulter::KvPrefaulter(std::vector<Region> regions, int num_blocks)
    : regions_(std::move(regions)), num_blocks_(num_blocks) {
  size_t largest = 1;
  for (const Region& r : regions_) largest = std::max(largest, r.block_bytes);
  ahead_ = std::max<int>(16, static_cast<int>(kHugePageBytes / largest));
  // The first step's blocks (the lowest: BlockManager hands them out in ascending order) at
  // once, while the worker finishes its start-up: a first step that faulted them itself,
  // one 2 MiB page per layer's K and V, took 0.1-0.3 s longer on a VM (a ~1.1B model's 44).
  target_ = std::min(num_blocks_, ahead_);
  thread_ = std::thread([this] { run(); });
}

KvPrefaulter::~KvPrefaulter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void KvPrefaulter::in_use_below(int end) {
  const int want = std::min(num_blocks_, std::max(0, end) + ahead_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (want <= target_) return;
    target_ = want;
  }
  cv_.notify_all();
}

int KvPrefaulter::populated_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return populated_;
}

void KvPrefaulter::run() {
  // A low priority, so that steps come first, but not SCHED_IDLE: madvise holds the process's
  // mmap_lock while it faults pages in, and a thread that starves while holding it stalls
  // every thread of the process that maps, unmaps or (behind that writer) faults memory. At
  // SCHED_IDLE (scheduler weight 3) on a host whose cores other processes keep busy, one 2 MiB
  // page took 2-6 s, and the heartbeat thread, blocked meanwhile, let the coordinator declare
  // the worker dead (3 missed heartbeats). At nice 10 (weight 110) the same page takes ~37x
  // less time, and the thread still yields to the steps' threads (weight 1024).
  setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || populated_ < target_; });
    if (stop_) return;
    const int from = populated_, to = target_;
    lock.unlock();
    bool ok = true;
    for (const Region& r : regions_) {
      ok = populate(r.base + static_cast<size_t>(from) * r.block_bytes, r.base + static_cast<size_t>(to) * r.block_bytes);
      if (!ok) break;
    }
    lock.lock();
    if (!ok) return;  // no MADV_POPULATE_WRITE here: first touches stay in the steps
    populated_ = to;
  }
}

}  // namespace tessera
