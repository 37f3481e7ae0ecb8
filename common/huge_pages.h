#pragma once
// When the large host buffers a CPU worker's weights live in go onto 2 MiB pages
// (model.weights_huge_pages): as each page is first written (Tensor::zeros' advice), or
// after start, by a background thread that moves them once they are written.
//
// Why after start: on a VM a 2 MiB page's first touch is expensive wherever the hypervisor
// has taken the guest's free memory back, and free memory is handed back to it exactly in
// 2 MiB blocks (virtio-balloon free page reporting), the size a huge page needs. Measured here
// (bench/page_touch.py 768, 2026-12-07): 768 MiB took 1.6-1.9 s to touch on huge pages after
// some idle seconds (4-5 ms a page), 77 ms right after another process freed them, and
// 0.37-0.42 s on 4 KiB pages either way. A ~1.1B Q4_K_M model's 770 MB of weights thus made
// tessera-serve's first answer 2.0-2.3 s after start instead of 0.8-1.2 s. Steps read the
// weights whole, and run faster on 2 MiB pages (docs/performance-cpu.md, "Memory
// placement"), hence the move afterwards instead of staying on 4 KiB pages.
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace tessera {

enum class WeightHugePages : uint8_t {
  kAuto,        // after_start in tessera-serve's workers, load elsewhere (ModelSection says why)
  kLoad,        // huge pages as the weights are first written
  kAfterStart,  // small pages at load, moved onto huge pages by a background thread
};
const char* weight_huge_pages_name(WeightHugePages w);  // "auto", "load", "after_start"

// A mapping Tensor::zeros made, whose huge-page advice was put off.
struct DeferredRange {
  std::weak_ptr<const void> owner;  // the mapping's owner: the range is gone once it expires
  char* begin = nullptr;            // 2 MiB aligned
  size_t bytes = 0;                 // a multiple of 2 MiB, all of it the mapping's
};

// While one lives, the large buffers Tensor::zeros maps on this thread get no huge-page
// advice; they are recorded here instead, for a HugePageMover. Nests; one thread's own.
class HugePageDeferral {
 public:
  HugePageDeferral();
  ~HugePageDeferral();
  HugePageDeferral(const HugePageDeferral&) = delete;
  HugePageDeferral& operator=(const HugePageDeferral&) = delete;

  // The ranges recorded so far (and forgets them).
  std::vector<DeferredRange> take() { return std::move(ranges_); }

  // For Tensor::zeros: records [begin, begin + bytes) (whole 2 MiB windows of its mapping) in
  // this thread's innermost deferral and returns true, or returns false where none is active
  // (the caller advises huge pages).
  static bool defer(const std::shared_ptr<const void>& owner, void* begin, size_t bytes);

 private:
  HugePageDeferral* outer_;
  std::vector<DeferredRange> ranges_;
};

struct HugePageMoveResult {
  size_t moved_bytes = 0;    // now on 2 MiB pages
  size_t failed_bytes = 0;   // windows the kernel would not collapse (no huge page free)
  bool collapse_supported = true;  // false: MADV_COLLAPSE refused (Linux before 6.1, THP off)
  bool stopped = false;            // stop was set before the end
  std::string describe() const;    // for the log line
};

// Moves every 2 MiB window of the ranges that has a page in memory onto a huge page
// (MADV_HUGEPAGE, then MADV_COLLAPSE), one window at a time, so the process ends up holding
// what the advice at load would have given it; windows never touched stay so. Stops between
// windows once *stop is set. Where the kernel cannot collapse, the windows keep the advice
// alone, for khugepaged to collapse over time.
HugePageMoveResult move_onto_huge_pages(const std::vector<DeferredRange>& ranges, const std::atomic<bool>* stop);

// move_onto_huge_pages on a thread of its own at a low priority (nice 10, as the KV
// prefaulter and for its reason: a collapse holds the process's mmap_lock for a moment, and
// at SCHED_IDLE a starved holder stalled every thread that maps memory, the heartbeat's too),
// logging the outcome with `who` ("rank 0/1") in front. Destroying it stops the thread
// between two windows.
class HugePageMover {
 public:
  HugePageMover(std::vector<DeferredRange> ranges, std::string who);
  ~HugePageMover();
  HugePageMover(const HugePageMover&) = delete;
  HugePageMover& operator=(const HugePageMover&) = delete;

  bool finished() const { return finished_.load(std::memory_order_acquire); }

 private:
  std::vector<DeferredRange> ranges_;
  std::string who_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tessera
