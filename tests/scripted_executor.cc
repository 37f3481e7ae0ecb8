// The GoogleTest side of tests/scripted_executor.h: a broken invariant fails the running test
// (and the step returns its error, so the test goes on to report what followed).
#include "tests/scripted_executor.h"

#include <gtest/gtest.h>

namespace tessera::testing {

void scripted_executor_violation(const std::string& what) { ADD_FAILURE() << "scripted executor: " << what; }

}  // namespace tessera::testing
