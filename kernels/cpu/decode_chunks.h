#pragma once
// How the decode GEMVs (float, bf16 dot, int8 rows, int8 panels) cut a weight matrix for OpenMP
// threads: contiguous chunks of about kDecodeChunkBytes that threads take dynamically.
// Each chunk is one sequential stream for the prefetchers, and a thread the OS preempts
// delays the step by one chunk instead of by its whole static share.
//
// The chunk count is a multiple of the thread count and the chunks are equal to within one
// alignment unit. Fixed-size chunks left a short last chunk that one thread ran after its
// share while the other waited: a 768 x 768 int8 layer is 24 panels, which 10-panel chunks
// split 14 / 10 between two threads (perf of ~100M decode: the join barrier of the small
// layers was ~8% of each thread's time).
#include <algorithm>
#include <cstdint>

namespace tessera::cpu::detail {

inline constexpr int64_t kDecodeChunkBytes = int64_t{256} << 10;

class DecodeChunks {
 public:
  // `units` of `unit_bytes` each (weight rows, panels); chunk edges at multiples of `align`
  // units (16 rows keeps neighbouring threads off each other's cache lines of y).
  DecodeChunks(int64_t units, int64_t unit_bytes, int64_t align, int threads)
      : units_(units), align_(align), slots_((units + align - 1) / align) {
    const int64_t bytes = units * std::max<int64_t>(1, unit_bytes);
    const int64_t by_size = std::max<int64_t>(1, (bytes + kDecodeChunkBytes / 2) / kDecodeChunkBytes);
    const int64_t t = std::max(1, threads);
    count_ = std::max<int64_t>(1, std::min(slots_, (by_size + t - 1) / t * t));
  }
  int64_t count() const { return count_; }
  // Units [begin(c), begin(c + 1)) form chunk c; begin(count()) == units.
  int64_t begin(int64_t c) const { return std::min(units_, c * slots_ / count_ * align_); }

 private:
  int64_t units_, align_, slots_, count_ = 1;
};

}  // namespace tessera::cpu::detail
