#include "bench/memory_bandwidth.h"

#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// dst[i] = src[i] with 16-byte loads and ordinary (write-allocate) stores, as STREAM's
// compiled copy does. A plain float loop is not vectorised at -O2 here (its pointers come
// through the OpenMP closure), and scalar copies top out below DRAM speed on some CPUs.
void copy_slice(const float* __restrict src, float* __restrict dst, long begin, long end) {
  long i = begin;
#if defined(__SSE2__)
  for (; i + 16 <= end; i += 16) {
    __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4);
    __m128 c = _mm_loadu_ps(src + i + 8), d = _mm_loadu_ps(src + i + 12);
    _mm_storeu_ps(dst + i, a);
    _mm_storeu_ps(dst + i + 4, b);
    _mm_storeu_ps(dst + i + 8, c);
    _mm_storeu_ps(dst + i + 12, d);
  }
#endif
  for (; i < end; ++i) dst[i] = src[i];
}

// Sum of src[begin, end) (a multiple of 16 long) with four independent vector sums, so the
// adds never limit the read rate. `streams` > 1 cuts the range into that many equal parts
// read side by side, one cache line of each per iteration: several sequential streams per
// core keep more DRAM requests in flight than one (as the GEMV's concurrent weight rows do),
// so the probe is not beaten by the kernels it is a ceiling for.
float sum_slice(const float* src, long begin, long end, int streams = 1) {
  const long lines = (end - begin) / 16;
  const long per = lines / streams;  // cache lines per stream; the rest goes to stream 0
#if defined(__SSE2__)
  __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  auto add_line = [&](const float* p) {
    s0 = _mm_add_ps(s0, _mm_loadu_ps(p));
    s1 = _mm_add_ps(s1, _mm_loadu_ps(p + 4));
    s2 = _mm_add_ps(s2, _mm_loadu_ps(p + 8));
    s3 = _mm_add_ps(s3, _mm_loadu_ps(p + 12));
  };
  for (long l = 0; l < per; ++l) {
    for (int s = 0; s < streams; ++s) add_line(src + begin + (s * per + l) * 16);
  }
  for (long l = per * streams; l < lines; ++l) add_line(src + begin + l * 16);
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
  (void)per;
  (void)streams;
  float s[16] = {};
  for (long i = begin; i < begin + lines * 16; i += 16) {
    for (int j = 0; j < 16; ++j) s[j] += src[i + j];
  }
  float total = 0;
  for (float v : s) total += v;
  return total;
#endif
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
    float* dst = b.get();
    const float* src = a.get();
    // Same slices as the first-touch loop above (static schedule, same thread count).
#pragma omp parallel
    {
      const long nt = omp_get_num_threads(), tid = omp_get_thread_num();
      const long per = (n + nt - 1) / nt;
      copy_slice(src, dst, std::min(n, tid * per), std::min(n, (tid + 1) * per));
    }
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
  // One stream per thread and eight per thread, each best of `repeats` (after a warm-up
  // pass); the faster is the ceiling.
  for (int streams : {1, 8}) {
    for (int r = 0; r < std::max(repeats, 1) + 1; ++r) {
      const auto start = std::chrono::steady_clock::now();
      float total = 0;
      const float* src = a.get();
#pragma omp parallel reduction(+ : total)
      {
        const long nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const long per = (n / 16 + nt - 1) / nt * 16;
        total += sum_slice(src, std::min(n / 16 * 16, tid * per), std::min(n / 16 * 16, (tid + 1) * per), streams);
      }
      const double t = seconds_since(start);
      sink = sink + total;
      if (r > 0) best = std::min(best, t);
    }
  }
  return static_cast<double>(n / 16 * 16) * sizeof(float) / best / 1e9;
}

}  // namespace tessera
