#pragma once
// What the CUDA runtime sees. Plain C++ header: callers never include CUDA headers.
#include <string>

namespace tessera::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device.
int device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for device 0, or why there is none.
std::string describe_device(int device);

}  // namespace tessera::cuda
