#pragma once
// How the compute kernels behave where there is a choice: the CPU kernels' A/B switches and
// the CUDA backend's debug sync. Resolved once per program, outside kernels/, from the
// configuration (worker.cpu.*, common/config.h) and then the environment variables that
// override it for experiments (docs/configuration.md, "worker.cpu"). The backends are handed
// the result (make_backend in kernels/backend.h, CpuBackend's constructor) and read nothing
// from the process, so two backends with different options can live in one process.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera {
namespace cpu {
// Instruction-set flavours of the CPU kernels, lowest first (avx2: AVX2 + FMA + F16C;
// avx512: F + BW + VL + DQ).
enum class CpuIsa : uint8_t { kScalar, kAvx2, kAvx512 };
const char* cpu_isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512"
// Which GEMM multiplies a linear's rows above the GEMV's (prefill, batched decode).
enum class GemmKernel : uint8_t { kAuto, kPacked, kOpenBlas };
// Which paged-attention kernel the CPU backend runs (kernels/cpu/attention_cpu.h).
enum class AttentionKernel : uint8_t { kTiled, kReference };
}  // namespace cpu

// The CPU backend's kernel choices. Each field is one key under worker.cpu and one
// environment variable that overrides it; the defaults are what measured fastest
// (docs/performance-cpu.md) with accuracy the tests hold.
struct CpuKernelOptions {
  // worker.cpu.isa, TESSERA_CPU_ISA: the highest SIMD flavour the kernels may use; nullopt
  // ("auto") = the best this CPU supports. It only lowers: a flavour the CPU lacks means its best.
  std::optional<cpu::CpuIsa> isa;
  // worker.cpu.gemm, TESSERA_CPU_GEMM: kAuto = the measured choice (packed_gemm_preferred in
  // kernels/cpu/linear_cpu.cc); kPacked = the packed GEMM wherever the flavour has one (not
  // scalar); kOpenBlas = OpenBLAS sgemm (int8 weights: dequantized panels).
  cpu::GemmKernel gemm = cpu::GemmKernel::kAuto;
  // worker.cpu.bf16_dot, TESSERA_CPU_BF16_DOT: where the CPU has AVX512_BF16, bf16 weights
  // multiply x rounded to bf16 with bf16 dot products (batch 2+ decode, prefill); false =
  // f32 arithmetic everywhere, bit-exact with the reference kernels.
  bool bf16_dot = true;
  // worker.cpu.int8_x16, TESSERA_CPU_INT8_X16: int8 weights multiply x carried in 16-bit
  // fixed point per group with integer dot products (AVX2, AVX-512); false = f32 x and the
  // kernels that widen int8 to f32.
  bool int8_x16 = true;
  // worker.cpu.int8_dot, TESSERA_CPU_INT8_DOT: int8 weights multiply x quantized to 8 bits
  // per group (llama.cpp's q8_0 x q8_0; no longer weight-only) at every row count.
  bool int8_dot = false;
  // worker.cpu.attention, TESSERA_CPU_ATTENTION: the tiled kernel, or the plain two-pass one
  // it is tested against.
  cpu::AttentionKernel attention = cpu::AttentionKernel::kTiled;
  // worker.cpu.pin_threads, TESSERA_PIN_THREADS: pin each OpenMP thread to its own CPU (the
  // pool is per process: the first backend that pins decides). Off whenever OMP_PROC_BIND or
  // OMP_PLACES is set: the user's own binding wins.
  bool pin_threads = true;

  bool operator==(const CpuKernelOptions&) const = default;
};

struct KernelOptions {
  CpuKernelOptions cpu;
  // TESSERA_CUDA_SYNC=1: the CUDA backend synchronises and checks after every launch, so a
  // failing kernel is named where it fails (debugging; slow).
  bool cuda_sync_every_launch = false;
};

// The spellings of each switch's values, shared by the worker.cpu keys and the variables.
const std::vector<std::pair<const char*, std::optional<cpu::CpuIsa>>>& cpu_isa_names();
const std::vector<std::pair<const char*, cpu::GemmKernel>>& cpu_gemm_names();
const std::vector<std::pair<const char*, cpu::AttentionKernel>>& cpu_attention_names();

// The variables resolve_kernel_options reads, as this process has them (unset ones absent).
std::map<std::string, std::string> kernel_environment();
// `configured` (the configuration's worker.cpu) with each variable of `env` that is set
// overriding its field, and the CUDA sync flag. A value a variable cannot take is an
// InvalidArgument naming the variable, the value and what it takes; an empty one is unset.
StatusOr<KernelOptions> resolve_kernel_options(const CpuKernelOptions& configured,
                                               const std::map<std::string, std::string>& env);
// resolve_kernel_options(configured, kernel_environment()): what programs without a
// configuration (tessera-generate, the benchmarks) run with.
StatusOr<KernelOptions> kernel_options_from_environment(const CpuKernelOptions& configured = {});

}  // namespace tessera
