// Device discovery for make_backend("auto"/"cuda"), and the first device code the build
// compiles: proves nvcc and the chosen CUDA architectures work even where no GPU runs it.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_probe.h"

namespace tessera::cuda {
namespace {

__global__ void fill_kernel(float* out, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string describe_device(int device) {
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  // Touch the device once so a broken driver shows up here, not in the first real kernel.
  float* buf = nullptr;
  if (cudaMalloc(&buf, sizeof(float) * 32) == cudaSuccess) {
    fill_kernel<<<1, 32>>>(buf, 1.0f, 32);
    cudaDeviceSynchronize();
    cudaFree(buf);
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
}

double peak_memory_bandwidth_gb_s(int device) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();
    return 0.0;
  }
  return 2.0 * static_cast<double>(clock_khz) * 1e3 * (bus_bits / 8.0) / 1e9;
}

}  // namespace tessera::cuda
