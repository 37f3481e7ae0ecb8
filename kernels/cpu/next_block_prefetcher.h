#pragma once
// Software prefetch of the weight rows a packed GEMM's next (chunk, K block) will pack, spread
// over the micro-kernel calls of the current one: packing then reads L2 instead of waiting on
// DRAM with nothing to overlap (measured: packing per call cost 15-25% at M = 32-64 without
// it, gemm_packed.cc). Used by gemm_packed.cc and gemm_int8_vnni.cc.
#include <algorithm>
#include <cstdint>

namespace tessera::cpu::detail {

class NextBlockPrefetcher {
 public:
  // Rows [n0, n1) of a row-major W (`w`, rows `row_bytes` apart), bytes [k0, k0 + kc) of
  // each, to be fetched over `calls` steps.
  void start(const void* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k0, int64_t kc, int64_t calls) {
    row_bytes_ = row_bytes;
    lines_per_row_ = std::max<int64_t>(1, (kc + 63) / 64);
    total_ = std::max<int64_t>(0, n1 - n0) * lines_per_row_;
    per_call_ = calls > 0 ? (total_ + calls - 1) / calls : total_;
    next_ = 0;
    row_ = static_cast<const char*>(w) + n0 * row_bytes_ + k0;
    line_ = 0;
  }
  // Walks (row, line) incrementally: a division per line cost as much as half the
  // micro-kernel's time at 32 rows (perf, batch-32 decode).
  void step() {
    const int64_t end = std::min(total_, next_ + per_call_);
    for (; next_ < end; ++next_) {
      __builtin_prefetch(row_ + line_ * 64, 0, 2);
      if (++line_ == lines_per_row_) {
        line_ = 0;
        row_ += row_bytes_;
      }
    }
  }

 private:
  const char* row_ = nullptr;
  int64_t row_bytes_ = 0, lines_per_row_ = 1, total_ = 0, per_call_ = 0, next_ = 0, line_ = 0;
};

}  // namespace tessera::cpu::detail
