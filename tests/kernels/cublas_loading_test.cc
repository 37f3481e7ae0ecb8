// cuBLAS is opened by the first CUDA backend, not at program start (kernels/cuda/cublas_library.h):
// a process that runs on the CPU — every test process, worker, tool and CPU-only server — must
// not have libcublas mapped, since loading it costs ~0.5 s of static initializers each time.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/backend.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/cuda_probe.h"
#endif

namespace tessera {
namespace {

bool cublas_is_mapped() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("libcublas") != std::string::npos) return true;
  }
  return false;
}

TEST(CublasLoading, ACpuBackendLeavesCublasUnloaded) {
  auto cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  EXPECT_FALSE(cublas_is_mapped()) << "libcublas is mapped in a process that made only a CPU backend";
}

TEST(CublasLoading, AutoWithoutAGpuLeavesCublasUnloaded) {
  if (auto_backend_kind() == BackendKind::kCuda) GTEST_SKIP() << "a CUDA device is visible: auto picks it";
  auto backend = make_backend("auto");
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  EXPECT_EQ((*backend)->kind(), BackendKind::kCpu);
  EXPECT_FALSE(cublas_is_mapped());
}

#ifdef TESSERA_WITH_CUDA
// The library and the seven functions the backend calls are found where the build found
// cuBLAS (no device needed). In a child process, so this process keeps cuBLAS unmapped for
// the tests above.
TEST(CublasLoading, TheBuildsCublasOpensWithEveryFunctionTheBackendCalls) {
  EXPECT_EXIT(
      {
        const Status st = cuda::load_cublas_library();
        if (!st.is_ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
        std::exit(st.is_ok() && cublas_is_mapped() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}
#endif

}  // namespace
}  // namespace tessera
