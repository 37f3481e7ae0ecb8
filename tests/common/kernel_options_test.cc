// The kernels' options (common/kernel_options.h): the worker.cpu keys of the configuration
// (YAML and --set; good values taken, bad ones refused naming the key), and the environment
// variables over them (a bad value refused naming the variable), resolved from a map so no
// test touches the process's environment.
#include "common/kernel_options.h"

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

#include "common/config.h"

namespace tessera {
// Failure messages show the fields, not the bytes.
inline void PrintTo(const CpuKernelOptions& o, std::ostream* os) {
  *os << "{isa " << (o.isa ? cpu::cpu_isa_name(*o.isa) : "auto") << ", gemm " << static_cast<int>(o.gemm)
      << ", bf16_dot " << o.bf16_dot << ", int8_x16 " << o.int8_x16 << ", int8_dot " << o.int8_dot << ", attention "
      << static_cast<int>(o.attention) << ", pin_threads " << o.pin_threads << "}";
}

namespace {

using Env = std::map<std::string, std::string>;

// Every field away from its default.
CpuKernelOptions every_switch_turned() {
  CpuKernelOptions o;
  o.isa = cpu::CpuIsa::kScalar;
  o.gemm = cpu::GemmKernel::kOpenBlas;
  o.bf16_dot = false;
  o.int8_x16 = false;
  o.int8_dot = true;
  o.attention = cpu::AttentionKernel::kReference;
  o.pin_threads = false;
  return o;
}

KernelOptions resolved_or_die(const CpuKernelOptions& configured, const Env& env) {
  StatusOr<KernelOptions> r = resolve_kernel_options(configured, env);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value() : KernelOptions{};
}

std::string resolve_error(const Env& env) {
  StatusOr<KernelOptions> r = resolve_kernel_options({}, env);
  EXPECT_FALSE(r.is_ok());
  return r.is_ok() ? "" : r.status().message();
}

TEST(KernelOptions, DefaultsAreTodaysKernels) {
  const CpuKernelOptions d;
  EXPECT_FALSE(d.isa.has_value());
  EXPECT_EQ(d.gemm, cpu::GemmKernel::kAuto);
  EXPECT_TRUE(d.bf16_dot);
  EXPECT_TRUE(d.int8_x16);
  EXPECT_FALSE(d.int8_dot);
  EXPECT_EQ(d.attention, cpu::AttentionKernel::kTiled);
  EXPECT_TRUE(d.pin_threads);
  const KernelOptions k = resolved_or_die(d, {});
  EXPECT_EQ(k.cpu, d);
  EXPECT_FALSE(k.cuda_sync_every_launch);
  EXPECT_STREQ(cpu::cpu_isa_name(cpu::CpuIsa::kAvx2), "avx2");
}

TEST(KernelOptions, EveryVariableOverridesItsField) {
  const KernelOptions k = resolved_or_die({}, {{"TESSERA_CPU_ISA", "scalar"},
                                               {"TESSERA_CPU_GEMM", "openblas"},
                                               {"TESSERA_CPU_BF16_DOT", "0"},
                                               {"TESSERA_CPU_INT8_X16", "0"},
                                               {"TESSERA_CPU_INT8_DOT", "1"},
                                               {"TESSERA_CPU_ATTENTION", "reference"},
                                               {"TESSERA_PIN_THREADS", "0"},
                                               {"TESSERA_CUDA_SYNC", "1"}});
  EXPECT_EQ(k.cpu, every_switch_turned());
  EXPECT_TRUE(k.cuda_sync_every_launch);
}

// The configuration is the base; a variable wins over it; unset and empty variables leave it.
TEST(KernelOptions, VariablesWinOverTheConfiguration) {
  CpuKernelOptions configured;
  configured.isa = cpu::CpuIsa::kAvx2;
  configured.bf16_dot = false;
  configured.gemm = cpu::GemmKernel::kPacked;
  const KernelOptions kept = resolved_or_die(configured, {{"TESSERA_CPU_ISA", ""}});
  EXPECT_EQ(kept.cpu, configured);
  const KernelOptions over = resolved_or_die(configured, {{"TESSERA_CPU_ISA", "avx512"}, {"TESSERA_CPU_BF16_DOT", "1"}});
  EXPECT_EQ(over.cpu.isa, cpu::CpuIsa::kAvx512);
  EXPECT_TRUE(over.cpu.bf16_dot);
  EXPECT_EQ(over.cpu.gemm, cpu::GemmKernel::kPacked);
  EXPECT_FALSE(resolved_or_die(configured, {{"TESSERA_CPU_ISA", "auto"}}).cpu.isa.has_value());
}

// OpenMP's own binding variables, set at all, turn our pinning off (the user's binding wins).
TEST(KernelOptions, OpenMpBindingTurnsPinningOff) {
  EXPECT_TRUE(resolved_or_die({}, {{"TESSERA_PIN_THREADS", "1"}}).cpu.pin_threads);
  EXPECT_FALSE(resolved_or_die({}, {{"OMP_PROC_BIND", "close"}}).cpu.pin_threads);
  EXPECT_FALSE(resolved_or_die({}, {{"OMP_PLACES", ""}}).cpu.pin_threads);
  EXPECT_FALSE(resolved_or_die({}, {{"TESSERA_PIN_THREADS", "1"}, {"OMP_PLACES", "cores"}}).cpu.pin_threads);
}

TEST(KernelOptions, BadValuesNameTheVariableAndWhatItTakes) {
  EXPECT_EQ(resolve_error({{"TESSERA_CPU_ISA", "sse"}}), "TESSERA_CPU_ISA=sse: expected one of auto, scalar, avx2, avx512");
  EXPECT_EQ(resolve_error({{"TESSERA_CPU_GEMM", "mkl"}}), "TESSERA_CPU_GEMM=mkl: expected one of auto, packed, openblas");
  EXPECT_EQ(resolve_error({{"TESSERA_CPU_BF16_DOT", "yes"}}), "TESSERA_CPU_BF16_DOT=yes: expected one of 0, 1");
  EXPECT_EQ(resolve_error({{"TESSERA_CPU_INT8_X16", "2"}}), "TESSERA_CPU_INT8_X16=2: expected one of 0, 1");
  EXPECT_EQ(resolve_error({{"TESSERA_CPU_INT8_DOT", "true"}}), "TESSERA_CPU_INT8_DOT=true: expected one of 0, 1");
  EXPECT_EQ(resolve_error({{"TESSERA_CPU_ATTENTION", "flash"}}),
            "TESSERA_CPU_ATTENTION=flash: expected one of tiled, reference");
  EXPECT_EQ(resolve_error({{"TESSERA_PIN_THREADS", "off"}}), "TESSERA_PIN_THREADS=off: expected one of 0, 1");
  EXPECT_EQ(resolve_error({{"TESSERA_CUDA_SYNC", "on"}}), "TESSERA_CUDA_SYNC=on: expected one of 0, 1");
}

TEST(KernelOptionsConfig, WorkerCpuKeysParse) {
  auto c = parse_config_yaml(R"(
worker:
  cpu: {isa: scalar, gemm: openblas, bf16_dot: false, int8_x16: false, int8_dot: true, attention: reference,
        pin_threads: false}
)", "cpu.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->worker.cpu, every_switch_turned());
  auto again = parse_config_yaml(dump_config_yaml(*c), "dumped.yaml");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->worker.cpu, every_switch_turned());
  auto avx2 = parse_config_yaml("worker: {cpu: {isa: avx2}}", "avx2.yaml");
  ASSERT_TRUE(avx2.is_ok()) << avx2.status().to_string();
  EXPECT_EQ(avx2->worker.cpu.isa, cpu::CpuIsa::kAvx2);
  EXPECT_EQ(TesseraConfig{}.worker.cpu, CpuKernelOptions{});
}

TEST(KernelOptionsConfig, SetOverridesEveryKey) {
  TesseraConfig c;
  for (const auto& [key, value] : std::map<std::string, std::string>{{"worker.cpu.isa", "scalar"},
                                                                     {"worker.cpu.gemm", "openblas"},
                                                                     {"worker.cpu.bf16_dot", "false"},
                                                                     {"worker.cpu.int8_x16", "false"},
                                                                     {"worker.cpu.int8_dot", "true"},
                                                                     {"worker.cpu.attention", "reference"},
                                                                     {"worker.cpu.pin_threads", "false"}}) {
    ASSERT_TRUE(apply_override_arg(c, key + "=" + value).is_ok()) << key;
    EXPECT_TRUE(c.gave(key)) << key;
  }
  EXPECT_EQ(c.worker.cpu, every_switch_turned());
  ASSERT_TRUE(apply_override(c, "worker.cpu.gemm", "packed").is_ok());
  EXPECT_EQ(c.worker.cpu.gemm, cpu::GemmKernel::kPacked);
  ASSERT_TRUE(apply_override(c, "worker.cpu.isa", "auto").is_ok());
  EXPECT_FALSE(c.worker.cpu.isa.has_value());
}

TEST(KernelOptionsConfig, BadValuesNameTheKey) {
  const std::string on_off = "expected true or false, got 'sse'";
  const std::map<std::string, std::string> expected = {
      {"worker.cpu.isa", "expected auto | scalar | avx2 | avx512, got 'sse'"},
      {"worker.cpu.gemm", "expected auto | packed | openblas, got 'sse'"},
      {"worker.cpu.bf16_dot", on_off},
      {"worker.cpu.int8_x16", on_off},
      {"worker.cpu.int8_dot", on_off},
      {"worker.cpu.attention", "expected tiled | reference, got 'sse'"},
      {"worker.cpu.pin_threads", on_off}};
  for (const auto& [key, what] : expected) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    auto from_file = parse_config_yaml("worker:\n  cpu:\n    " + leaf + ": sse\n", "bad.yaml");
    ASSERT_FALSE(from_file.is_ok()) << key;
    EXPECT_EQ(from_file.status().message(), "bad.yaml:3:" + std::to_string(7 + leaf.size()) + ": " + key + ": " + what);
    TesseraConfig c;
    const Status from_set = apply_override(c, key, "sse");
    ASSERT_FALSE(from_set.is_ok()) << key;
    EXPECT_EQ(from_set.message(), "--set: " + key + ": " + what);
  }
  auto unknown = parse_config_yaml("worker:\n  cpu:\n    isas: avx2\n", "typo.yaml");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("worker.cpu.isas: unknown key (did you mean 'isa'?)"), std::string::npos)
      << unknown.status().message();
}

}  // namespace
}  // namespace tessera
