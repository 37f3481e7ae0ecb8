#pragma once
// cuBLAS, opened when the first CUDA backend is made instead of when the program starts.
// Linking libcublas made every process pay its libraries' start-up (~0.4-0.6 s of static
// initializers in libcublasLt, measured on an empty program) whether or not it ever used a
// GPU: every CPU-only tessera-serve, worker, tool and test process. The functions the backend
// calls are looked up once by name; everything else about cuBLAS (types, enums) still comes
// from its headers. Host code of kernels/cuda/ only.
#include <cublas_v2.h>

#include "common/status.h"

namespace tessera::cuda {

// cublasGemmEx with cuBLAS's compute-type enum (the header overloads it for C++ callers with a
// wrapper taking a cudaDataType compute type).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k,
                                        const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                                        cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type,
                                        int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo);

struct CublasLibrary {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  CublasGemmEx gemm_ex = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// Opens libcublas (the major version this build was compiled against) on the first call and
// every later one returns that result: the functions, or an Unavailable error naming the
// library or the missing function. Thread-safe.
StatusOr<const CublasLibrary*> load_cublas();

// The functions, for code that runs only after load_cublas() succeeded (a CudaBackend exists).
const CublasLibrary& cublas();

}  // namespace tessera::cuda
