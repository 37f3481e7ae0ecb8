#include "common/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "common/logging.h"
#include "common/tensor.h"
#include "common/thread_priority.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack the name
#endif

namespace tessera {
namespace {

thread_local HugePageDeferral* innermost = nullptr;

// Whether any 4 KiB page of the window is in memory. A window with some is collapsed whole,
// as a first touch would have mapped it under the advice at load; one never touched (an
// arena chunk's unused tail) stays untouched.
bool touched(char* window) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in(kHugePageBytes / page);
  if (mincore(window, kHugePageBytes, in.data()) != 0) return false;
  for (unsigned char c : in) {
    if ((c & 1) != 0) return true;
  }
  return false;
}

enum class Collapse { kDone, kFailed, kUnsupported };

Collapse collapse(char* window) {
  (void)madvise(window, kHugePageBytes, MADV_HUGEPAGE);  // also khugepaged's cue where collapse is refused
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (madvise(window, kHugePageBytes, MADV_COLLAPSE) == 0) return Collapse::kDone;
    if (errno == EINVAL) return Collapse::kUnsupported;
    if (errno != EAGAIN) break;  // ENOMEM: no huge page to be had now
  }
  return Collapse::kFailed;
}

}  // namespace

const char* weight_huge_pages_name(WeightHugePages w) {
  switch (w) {
    case WeightHugePages::kLoad:
      return "load";
    case WeightHugePages::kAfterStart:
      return "after_start";
    case WeightHugePages::kAuto:
      break;
  }
  return "auto";
}

HugePageDeferral::HugePageDeferral() : outer_(innermost) { innermost = this; }

HugePageDeferral::~HugePageDeferral() { innermost = outer_; }

bool HugePageDeferral::defer(const std::shared_ptr<const void>& owner, void* begin, size_t bytes) {
  if (innermost == nullptr) return false;
  innermost->ranges_.push_back({owner, static_cast<char*>(begin), bytes});
  return true;
}

std::string HugePageMoveResult::describe() const {
  auto mib = [](size_t b) { return static_cast<double>(b) / (1 << 20); };
  char line[256];
  std::snprintf(line, sizeof line, "%.1f MiB moved onto 2 MiB pages", mib(moved_bytes));
  std::string s = line;
  if (failed_bytes > 0) {
    std::snprintf(line, sizeof line, ", %.1f MiB left on 4 KiB pages (%s)", mib(failed_bytes),
                  collapse_supported ? "no huge page free" : "this kernel cannot collapse pages: MADV_COLLAPSE needs "
                                                             "Linux 6.1 and transparent huge pages not 'never'; "
                                                             "khugepaged may move them over minutes");
    s += line;
  }
  if (stopped) s += ", stopped before the end";
  return s;
}

HugePageMoveResult move_onto_huge_pages(const std::vector<DeferredRange>& ranges, const std::atomic<bool>* stop) {
  HugePageMoveResult r;
  for (const DeferredRange& range : ranges) {
    for (size_t off = 0; off + kHugePageBytes <= range.bytes; off += kHugePageBytes) {
      if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
        r.stopped = true;
        return r;
      }
      // Held for the window's move, so the mapping cannot go (and its address be reused) meanwhile.
      const std::shared_ptr<const void> alive = range.owner.lock();
      if (!alive) break;
      char* window = range.begin + off;
      if (!touched(window)) continue;
      if (!r.collapse_supported) {
        (void)madvise(window, kHugePageBytes, MADV_HUGEPAGE);
        r.failed_bytes += kHugePageBytes;
        continue;
      }
      switch (collapse(window)) {
        case Collapse::kDone:
          r.moved_bytes += kHugePageBytes;
          break;
        case Collapse::kUnsupported:
          r.collapse_supported = false;
          [[fallthrough]];
        case Collapse::kFailed:
          r.failed_bytes += kHugePageBytes;
          break;
      }
    }
  }
  return r;
}

HugePageMover::HugePageMover(std::vector<DeferredRange> ranges, std::string who)
    : ranges_(std::move(ranges)), who_(std::move(who)) {
  thread_ = std::thread([this] {
    lower_this_thread_priority(10);
    const auto start = std::chrono::steady_clock::now();
    const HugePageMoveResult r = move_onto_huge_pages(ranges_, &stop_);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!r.stopped) {
      TESSERA_LOG_INFO("{}: weights on huge pages after start (model.weights_huge_pages after_start): {} in {:.1f} s",
                       who_, r.describe(), seconds);
    }
    ranges_.clear();  // let the mappings go with their tensors
    finished_.store(true, std::memory_order_release);
  });
}

HugePageMover::~HugePageMover() {
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
}

}  // namespace tessera
