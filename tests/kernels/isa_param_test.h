#pragma once
// A test run once per CPU kernel flavour (the parameter): a flavour this CPU lacks is skipped,
// visibly, naming what it has.
#include <gtest/gtest.h>

#include "kernels/cpu/linear_cpu.h"  // CpuIsa, detected_cpu_isa, cpu_isa_name

namespace tessera::cpu {

class IsaParamTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() > detected_cpu_isa())
      GTEST_SKIP() << "SKIPPED: this CPU lacks " << cpu_isa_name(GetParam()) << " (has "
                   << cpu_isa_name(detected_cpu_isa()) << ")";
  }
};

}  // namespace tessera::cpu
