#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "common/check.h"
#include "kernels/cuda/cuda_probe.h"

// cublas_v2.h maps the API names to versioned symbols (cublasCreate -> cublasCreate_v2): the
// name is stringized after that expansion, so the lookup asks for the symbol the header means.
#define TESSERA_CUBLAS_SYMBOL_NAME(api) TESSERA_CUBLAS_STRINGIZE(api)
#define TESSERA_CUBLAS_STRINGIZE(symbol) #symbol

namespace tessera::cuda {
namespace {

#define TESSERA_CUBLAS_STRINGIZE_VERSION(v) TESSERA_CUBLAS_STRINGIZE(v)
constexpr const char* kLibraryName = "libcublas.so." TESSERA_CUBLAS_STRINGIZE_VERSION(CUBLAS_VER_MAJOR);

template <typename Function>
Status look_up(void* library, const char* symbol, Function* out) {
  *out = reinterpret_cast<Function>(dlsym(library, symbol));
  if (*out == nullptr) return Status(StatusCode::kUnavailable, std::string(kLibraryName) + " has no " + symbol);
  return Status::ok();
}

StatusOr<CublasLibrary> open_cublas() {
  void* library = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return Status(StatusCode::kUnavailable, std::string("cannot load cuBLAS (") + kLibraryName + "): " +
                                                (why != nullptr ? why : "unknown error"));
  }
  // Never closed: cuBLAS handles and their kernels live until the process ends.
  CublasLibrary f;
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasCreate), &f.create));
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasDestroy), &f.destroy));
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasSetStream), &f.set_stream));
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasSetMathMode), &f.set_math_mode));
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasGemmEx), &f.gemm_ex));
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasGetStatusName), &f.status_name));
  TESSERA_RETURN_IF_ERROR(look_up(library, TESSERA_CUBLAS_SYMBOL_NAME(cublasGetStatusString), &f.status_string));
  return f;
}

const StatusOr<CublasLibrary>& loaded() {
  static const StatusOr<CublasLibrary> library = open_cublas();
  return library;
}

}  // namespace

StatusOr<const CublasLibrary*> load_cublas() {
  if (!loaded().is_ok()) return loaded().status();
  return &loaded().value();
}

Status load_cublas_library() { return load_cublas().status(); }

const CublasLibrary& cublas() {
  TESSERA_CHECK(loaded().is_ok()) << "cuBLAS used before it was loaded: " << loaded().status().to_string();
  return loaded().value();
}

}  // namespace tessera::cuda
