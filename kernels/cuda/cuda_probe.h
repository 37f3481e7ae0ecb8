#pragma once
// What the CUDA runtime sees. Plain C++ header: callers never include CUDA headers.
#include <string>

#include "common/status.h"

namespace tessera::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device.
int device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for device 0, or why there is none.
std::string describe_device(int device);
// The device's theoretical peak memory bandwidth in GB/s (10^9 bytes/s): memory clock x bus
// width x 2 (double data rate), from the device attributes; 0 when it cannot be read.
double peak_memory_bandwidth_gb_s(int device);
// Opens cuBLAS as the first CUDA backend does (kernels/cuda/cublas_library.h) and says whether
// it and every function the backend calls were found. Needs no device.
Status load_cublas_library();

}  // namespace tessera::cuda
