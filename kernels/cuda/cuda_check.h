#pragma once
// Turning CUDA runtime and cuBLAS failures into clear errors. Host code of kernels/cuda/
// only (it includes CUDA headers). Two policies, as everywhere in Tessera:
//
//   TESSERA_CUDA_CHECK(cudaMalloc(&p, n));      // an invariant: aborts with the call text,
//   TESSERA_CUBLAS_CHECK(cublasGemmEx(...));    // file:line, device and the error string
//   TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(d));  // expected failure: returns a Status
//
// A failed kernel launch surfaces at the next call that checks (usually the launch
// check right after it); set TESSERA_CUDA_SYNC=1 to synchronise after every launch so the
// failing kernel is the one named. NCCL_CHECK arrives with the NCCL communicator.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "common/check.h"
#include "common/status.h"
#include "kernels/cuda/cublas_library.h"

namespace tessera::cuda {

inline int current_device() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) return -1;
  return d;
}

// "cudaErrorMemoryAllocation (out of memory) on device 0"
inline std::string describe_cuda_error(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ") on device " +
         std::to_string(current_device());
}

inline std::string describe_cublas_error(cublasStatus_t st) {
  return std::string(cublas().status_name(st)) + " (" + cublas().status_string(st) + ") on device " +
         std::to_string(current_device());
}

inline Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  return internal_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                        describe_cuda_error(err));
}

inline Status cublas_status(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return internal_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                        describe_cublas_error(st));
}

}  // namespace tessera::cuda

#define TESSERA_CUDA_CHECK(expr)                                                               \
  do {                                                                                         \
    const cudaError_t _tessera_cuda_err = (expr);                                              \
    if (_tessera_cuda_err != cudaSuccess) {                                                    \
      ::tessera::detail::CheckFailure(__FILE__, __LINE__, #expr).stream()                      \
          << "CUDA error: " << ::tessera::cuda::describe_cuda_error(_tessera_cuda_err);        \
    }                                                                                          \
  } while (0)

#define TESSERA_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                         \
    const cublasStatus_t _tessera_cublas_st = (expr);                                          \
    if (_tessera_cublas_st != CUBLAS_STATUS_SUCCESS) {                                         \
      ::tessera::detail::CheckFailure(__FILE__, __LINE__, #expr).stream()                      \
          << "cuBLAS error: " << ::tessera::cuda::describe_cublas_error(_tessera_cublas_st);   \
    }                                                                                          \
  } while (0)

#define TESSERA_CUDA_RETURN_IF_ERROR(expr) \
  TESSERA_RETURN_IF_ERROR(::tessera::cuda::cuda_status((expr), #expr, __FILE__, __LINE__))

#define TESSERA_CUBLAS_RETURN_IF_ERROR(expr) \
  TESSERA_RETURN_IF_ERROR(::tessera::cuda::cublas_status((expr), #expr, __FILE__, __LINE__))
