// A process dying of a fatal signal names it on stderr with a stack, then dies of that signal.
#include "common/crash_report.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "tests/test_support.h"

namespace tessera {
namespace {

TEST(CrashReport, AFatalSignalIsNamedWithAStackAndStillKillsTheProcess) {
  if (testing::kSanitizedBuild) GTEST_SKIP() << "the sanitizers report fatal signals themselves";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_crash_report("w7");
        ::raise(SIGSEGV);
      },
      ::testing::KilledBySignal(SIGSEGV), "\\[w7\\] fatal signal 11 \\(SIGSEGV\\); stack");
  EXPECT_EXIT(
      {
        install_crash_report("coord");
        std::abort();
      },
      ::testing::KilledBySignal(SIGABRT), "\\[coord\\] fatal signal 6 \\(SIGABRT\\)");
}

}  // namespace
}  // namespace tessera
