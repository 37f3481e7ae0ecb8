#pragma once
// The threads that compute a step's structured-output masks: the engine thread and a few
// helpers, so that a batch of constrained sequences costs about its slowest mask rather than
// the sum of them (docs/structured-output.md, "Where the mask is computed").
//
// Why a pool here and not OpenMP: the coordinator links no OpenMP (it never runs kernels), and
// OpenMP's idle threads spin-wait after a parallel region (GOMP_SPINCOUNT) — on a CPU
// deployment they would spin on the cores the workers' forward pass is about to use. These
// helpers block on a condition variable, and are only started when a step first has two
// constrained sequences (an unconstrained server never starts them).
#include <cstddef>
#include <functional>
#include <memory>

namespace tessera::structured {

class MaskPool {
 public:
  // At most `threads` threads work at once, the caller included (1: everything on the caller).
  explicit MaskPool(int threads = default_threads());
  ~MaskPool();
  MaskPool(const MaskPool&) = delete;
  MaskPool& operator=(const MaskPool&) = delete;

  // Calls fn(i) for every i in [0, n), each once, on the caller and the helpers, and returns
  // when every call has returned. fn must be safe to run concurrently for different i (and
  // must not throw). Calls from several threads at once are serialized.
  void run(size_t n, const std::function<void(size_t)>& fn);
  int threads() const { return threads_; }

  // TESSERA_MASK_THREADS when set (1 = serial, as before this pool existed), else the
  // hardware threads, at most 8 (a step has few constrained sequences whose masks are cold;
  // more threads only wait).
  static int default_threads();

 private:
  struct Shared;
  int threads_;
  std::unique_ptr<Shared> shared_;
};

}  // namespace tessera::structured
