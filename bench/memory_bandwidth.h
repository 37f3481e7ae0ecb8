#pragma once
// The memory-bandwidth roofline that decode throughput is compared against.
#include <cstddef>

namespace tessera {

// STREAM-style copy (b[i] = a[i] over float arrays) of `bytes` per array, best of `repeats`,
// all OpenMP threads (omp_get_max_threads()) each copying its own contiguous slice (first
// touched by the same thread). Returns GB/s counting bytes read + bytes written (2 * bytes per
// pass; 1e9 bytes per GB), as STREAM reports "Copy". Use arrays well beyond the last-level
// cache (the default is 256 MiB each).
double measure_copy_bandwidth_gb_s(size_t bytes = size_t{256} << 20, int repeats = 5);

// Read-only companion (STREAM-style reduce): sums `bytes` of floats, all threads, each
// summing its own slice as one sequential stream and as eight side by side; the best pass
// of `repeats` per variant. GB/s of bytes read. A decode step only reads weights, so this
// is the ceiling tessera-bench divides decode's weight traffic by.
double measure_read_bandwidth_gb_s(size_t bytes = size_t{256} << 20, int repeats = 5);

}  // namespace tessera
