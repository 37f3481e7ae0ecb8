#include "common/thread_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace tessera {

void lower_this_thread_priority(int increment) {
  // On Linux PRIO_PROCESS with a thread id sets that thread's nice value alone.
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  (void)setpriority(PRIO_PROCESS, tid, now + increment);
}

}  // namespace tessera
