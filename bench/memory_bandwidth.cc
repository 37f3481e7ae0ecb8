#include "bench/memory_bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

namespace tessera {
namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;

FloatBuffer alloc_floats(size_t n) {
  size_t bytes = (n * sizeof(float) + 4095) / 4096 * 4096;
  return FloatBuffer(static_cast<float*>(std::aligned_alloc(4096, std::max<size_t>(bytes, 4096))));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double measure_copy_bandwidth_gb_s(size_t bytes, int repeats) {
  const long n = static_cast<long>(bytes / sizeof(float));
  FloatBuffer a = alloc_floats(n), b = alloc_floats(n);
  // First touch by the thread that will copy the slice (NUMA placement, page faults out of
  // the timed loop); static schedules give each thread the same slice every time.
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    a[i] = 1.0f;
    b[i] = 0.0f;
  }
  double best = 1e300;
  for (int r = 0; r < std::max(repeats, 1) + 1; ++r) {  // one extra untimed warm-up pass
    const auto start = std::chrono::steady_clock::now();
    float* __restrict dst = b.get();
    const float* __restrict src = a.get();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) dst[i] = src[i];
    const double t = seconds_since(start);
    if (r > 0) best = std::min(best, t);
  }
  return 2.0 * static_cast<double>(n) * sizeof(float) / best / 1e9;
}

double measure_read_bandwidth_gb_s(size_t bytes, int repeats) {
  const long n = static_cast<long>(bytes / sizeof(float));
  FloatBuffer a = alloc_floats(n);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) a[i] = 1.0f;
  double best = 1e300;
  volatile float sink = 0;
  for (int r = 0; r < std::max(repeats, 1) + 1; ++r) {
    const auto start = std::chrono::steady_clock::now();
    float total = 0;
    const float* src = a.get();
    // Eight partial sums per thread so the adds do not limit the read rate.
#pragma omp parallel reduction(+ : total)
    {
      float s[8] = {};
#pragma omp for schedule(static)
      for (long i = 0; i < n / 8 * 8; i += 8) {
        for (int j = 0; j < 8; ++j) s[j] += src[i + j];
      }
      for (int j = 0; j < 8; ++j) total += s[j];
    }
    const double t = seconds_since(start);
    sink = sink + total;
    if (r > 0) best = std::min(best, t);
  }
  return static_cast<double>(n / 8 * 8) * sizeof(float) / best / 1e9;
}

}  // namespace tessera
