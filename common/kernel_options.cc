#include "common/kernel_options.h"

#include <cstdlib>

namespace tessera {
namespace {

using Environment = std::map<std::string, std::string>;

// The on/off variables' spellings (YAML's worker.cpu keys take true/false instead).
const std::vector<std::pair<const char*, bool>> kOnOff = {{"0", false}, {"1", true}};

// Every variable resolve_kernel_options reads.
const char* const kKernelVariables[] = {"TESSERA_CPU_ISA",      "TESSERA_CPU_GEMM",    "TESSERA_CPU_BF16_DOT",
                                        "TESSERA_CPU_INT8_X16", "TESSERA_CPU_INT8_DOT", "TESSERA_CPU_ATTENTION",
                                        "TESSERA_PIN_THREADS",  "OMP_PROC_BIND",        "OMP_PLACES",
                                        "TESSERA_CUDA_SYNC"};

// The one parser of every switch: *field = the value `names` spells as variable `name`'s,
// when it is set and not empty.
template <typename T>
Status override_from(const Environment& env, const char* name, const std::vector<std::pair<const char*, T>>& names,
                     T* field) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return Status::ok();
  std::string expected;
  for (const auto& [spelling, value] : names) {
    if (it->second == spelling) {
      *field = value;
      return Status::ok();
    }
    expected += (expected.empty() ? "" : ", ") + std::string(spelling);
  }
  return invalid_argument(std::string(name) + "=" + it->second + ": expected one of " + expected);
}

Status override_cpu_options(const Environment& env, CpuKernelOptions* cpu) {
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CPU_ISA", cpu_isa_names(), &cpu->isa));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CPU_GEMM", cpu_gemm_names(), &cpu->gemm));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CPU_BF16_DOT", kOnOff, &cpu->bf16_dot));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CPU_INT8_X16", kOnOff, &cpu->int8_x16));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CPU_INT8_DOT", kOnOff, &cpu->int8_dot));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CPU_ATTENTION", cpu_attention_names(), &cpu->attention));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_PIN_THREADS", kOnOff, &cpu->pin_threads));
  // Set at all (even empty), OpenMP's own binding variables keep our pinning out of the way.
  if (env.count("OMP_PROC_BIND") != 0 || env.count("OMP_PLACES") != 0) cpu->pin_threads = false;
  return Status::ok();
}

}  // namespace

const char* cpu::cpu_isa_name(CpuIsa isa) {
  for (const auto& [spelling, value] : cpu_isa_names()) {
    if (value == isa) return spelling;
  }
  return "?";
}

const std::vector<std::pair<const char*, std::optional<cpu::CpuIsa>>>& cpu_isa_names() {
  static const std::vector<std::pair<const char*, std::optional<cpu::CpuIsa>>> names = {
      {"auto", std::nullopt},
      {"scalar", cpu::CpuIsa::kScalar},
      {"avx2", cpu::CpuIsa::kAvx2},
      {"avx512", cpu::CpuIsa::kAvx512}};
  return names;
}

const std::vector<std::pair<const char*, cpu::GemmKernel>>& cpu_gemm_names() {
  static const std::vector<std::pair<const char*, cpu::GemmKernel>> names = {
      {"auto", cpu::GemmKernel::kAuto}, {"packed", cpu::GemmKernel::kPacked}, {"openblas", cpu::GemmKernel::kOpenBlas}};
  return names;
}

const std::vector<std::pair<const char*, cpu::AttentionKernel>>& cpu_attention_names() {
  static const std::vector<std::pair<const char*, cpu::AttentionKernel>> names = {
      {"tiled", cpu::AttentionKernel::kTiled}, {"reference", cpu::AttentionKernel::kReference}};
  return names;
}

std::map<std::string, std::string> kernel_environment() {
  Environment env;
  for (const char* name : kKernelVariables) {
    if (const char* value = std::getenv(name)) env[name] = value;
  }
  return env;
}

StatusOr<KernelOptions> resolve_kernel_options(const CpuKernelOptions& configured, const Environment& env) {
  KernelOptions options;
  options.cpu = configured;
  TESSERA_RETURN_IF_ERROR(override_cpu_options(env, &options.cpu));
  TESSERA_RETURN_IF_ERROR(override_from(env, "TESSERA_CUDA_SYNC", kOnOff, &options.cuda_sync_every_launch));
  return options;
}

StatusOr<KernelOptions> kernel_options_from_environment(const CpuKernelOptions& configured) {
  return resolve_kernel_options(configured, kernel_environment());
}

}  // namespace tessera
