// LocalWorkers (coordinator/cluster/local_workers.h): a rank's process that exits soon after it
// started is started again after a pause that doubles each time, not at every supervisor pass.
#include "coordinator/cluster/local_workers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace tessera {
namespace {

TEST(LocalWorkers, AWorkerThatExitsAtOnceIsStartedAgainLessAndLessOften) {
  LocalWorkers workers;
  // /bin/false ignores the arguments a worker gets and exits at once: a crash loop.
  ASSERT_TRUE(workers.start("/bin/false", "/dev/null", 1).is_ok());
  int starts = 1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1600);
  while (std::chrono::steady_clock::now() < until) {
    starts += workers.restart_exited();  // as tessera-serve's supervisor does, every 10 ms here
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Every pass would start it again ~160 times; pauses of 0.1, 0.2, 0.4 and 0.8 s allow 5.
  EXPECT_GE(starts, 3);
  EXPECT_LE(starts, 6);
  workers.stop();
}

}  // namespace
}  // namespace tessera
